"""The kernel compiler: a site lowered to a loop IR (`ir`, through PyTorch's decompositions in
`lower`), planned as one kernel's rows, columns and reductions (`plan`, with the index algebra of
`index`), and laid out by a schedule the search changes (`schedule`). The Triton backend writes
it (`generators.triton.compiled`)."""
