"""What an operator looks at: which transaction holds a partition's maxReadPosition back, who
produces to it and at what rate, and a picture of its recent history. Read-only: nothing here
writes to the root."""
