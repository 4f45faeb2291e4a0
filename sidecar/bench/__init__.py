"""`mqfed bench`: a load generator, a measuring subscriber and the three-case benchmark."""
