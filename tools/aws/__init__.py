"""What the stack is made of: the template as SAM reads it, a deployed stack's outputs, Lambda's runtime libraries."""
