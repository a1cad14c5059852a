"""flower-pfl: personalized federated learning algorithms as Flower strategies and clients."""

__version__ = "0.1.0"
