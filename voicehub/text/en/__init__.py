"""English frontend: normalisation and ARPAbet g2p (needs the `en` extra)."""
