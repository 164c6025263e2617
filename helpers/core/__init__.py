"""The ground floor: arguments, device and scale, data, the training step's pieces, units, plots, display.

Every other package may import it; it imports no other package of helpers.
"""
