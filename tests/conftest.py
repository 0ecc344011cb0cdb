import os
import sys

# Tests import the flat scripts (model.py, train.py, ...) from the repository root.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
