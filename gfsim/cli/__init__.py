"""The ``gfsim`` command line: thin commands that parse, call the library and print. The top
layer: nothing in gfsim imports it.
"""
