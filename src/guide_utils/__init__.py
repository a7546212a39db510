"""guide_utils: the small, tested library behind the guide.

Notebooks, sbatch scripts, benchmarks and tests all call into this package, so that what
runs on a laptop is what runs on a cluster. Importing it has no side effects and does not
import torch or TensorFlow; each submodule imports what it needs.
"""

__version__ = "0.1.0"
