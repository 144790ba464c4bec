"""What a case is made of: the op table (one entry per ggml op: signature, shape rule,
builder), the consumers between the op and the loss, and the losses. Add an op here."""
