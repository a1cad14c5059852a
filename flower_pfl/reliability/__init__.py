"""What keeps a run correct when parts of it fail (docs/reliability.md), one job a module.

``uploads`` the layout of an upload and a download (model part, named extra parts);
``upload_checks`` why an upload is rejected; ``checkpoints`` atomic checkpoints, the
resume's configuration check and the results rewind; ``stop`` a run asked to stop after
its round; ``preflight`` the output folder, data and model checked before a run starts.
"""
