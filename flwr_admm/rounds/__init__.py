"""The round layer: what a round does, without either Flower API's message types."""
