"""Conditional flow matching of GPT-SoVITS v3: the DiT estimator and its fixed-step solver."""

from voicehub.models.gpt_sovits.cfm.dit import CFM, DiT
from voicehub.models.gpt_sovits.cfm.schedule import StepCache, dyadic_steps, uniform_steps
from voicehub.models.gpt_sovits.cfm.solver import euler_step, solve

__all__ = ["CFM", "DiT", "StepCache", "dyadic_steps", "euler_step", "solve", "uniform_steps"]
