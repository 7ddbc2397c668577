"""One weight sync: the payload, the byte-bucket transport, capture strategies and the pipeline that drives them."""
