"""The model on its device: the Llama-family decoder (`llama`), rope and paged attention (`attention`), loading a
checkpoint into it (`loader`), and the CPU weight layout and BLAS path its linear layers run on (`cpu_layout`,
`cpu_blas`).
"""
