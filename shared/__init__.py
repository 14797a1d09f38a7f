"""Code shared by every function of the annotation pipeline, and the local runner around them."""
