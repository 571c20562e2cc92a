"""Reading and writing the .pt2b container: header, program flatbuffer, weight segments."""
