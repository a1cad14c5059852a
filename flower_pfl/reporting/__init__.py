"""Reporting: results on disk (writer and reader), statistics over seeds, tables, figures,
the console a researcher watches, TensorBoard tracking."""
