"""Reading rows and packed blocks by position: tasks to tensors, reads in flight, retries."""
