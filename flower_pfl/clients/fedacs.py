"""FedACS client -- eq. 5 of Chen, Li, Shen: w_i = u_i - beta_k grad F_i(u_i).

The client takes its intermediate model u_i as the INITIALISATION (no regulariser: the
paper argues this suits scarce local data) and runs the configured local SGD steps
(eq. 5 is the one-step case; the experiments use several).  w_i is kept as the
personalized model and uploaded.
"""

from __future__ import annotations

from flower_pfl.catalog import fedacs
from flower_pfl.clients.base import PersonalStateClient
from flower_pfl.registry import client_for


@client_for(fedacs.FEDACS)
class FedACSClient(PersonalStateClient):
    """Local SGD started from u_i; everything else is the shared personal-state client."""
