"""Task families for data/build_tasks.py. Each module has `specs() -> list[OpSpec]`."""
from taskgen import elementwise

# Order fixes the order of lines in tasks.jsonl.
FAMILIES = [elementwise]
