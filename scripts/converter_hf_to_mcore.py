"""verl's converter path: ``python scripts/converter_hf_to_mcore.py --hf_model_path ... --output_path ...`` runs
:mod:`verl.models.mcore.converter_hf_to_mcore` (same arguments)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verl.models.mcore.converter_hf_to_mcore import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
