"""The reference fleet simulator: jobs, physical throughput truth (the oracle), scheduler."""

from leap.sim.calibrate import calibrate, calibration_from_table
from leap.sim.fleet import Fleet
from leap.sim.run import SimReport, simulate, simulate_day
from leap.sim.scenario import Scenario
from leap.sim.scheduler import CapacityScheduler, Placement

__all__ = ["CapacityScheduler", "Fleet", "Placement", "Scenario", "SimReport", "calibrate",
           "calibration_from_table", "simulate", "simulate_day"]
