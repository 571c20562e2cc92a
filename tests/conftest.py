import os
import sys

# the suite tests lowering itself; tests of the lowering cache turn it on in a folder of their own
os.environ["PT2B_CACHE"] = "off"

sys.path.insert(0, os.path.dirname(__file__))
