"""The lab: ``lance_table`` (every stage's outputs joined into one Lance table) and its maintenance job."""

from prx_assets.defs.lab.assets import CURSOR_KEY, LAB_INPUTS, lab_fingerprint_of, lance_table
from prx_assets.defs.lab.maintenance import (
    lance_maintenance,
    lance_maintenance_schedule,
    lance_maintenance_sensor,
)

__all__ = ['CURSOR_KEY', 'LAB_INPUTS', 'lab_fingerprint_of', 'lance_maintenance', 'lance_maintenance_schedule', 'lance_maintenance_sensor', 'lance_table']
