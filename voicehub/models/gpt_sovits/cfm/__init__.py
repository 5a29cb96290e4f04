"""Conditional flow matching of GPT-SoVITS v3: the DiT estimator and its fixed-step solver."""

from voicehub.models.gpt_sovits.cfm.dit import CFM, DiT
from voicehub.models.gpt_sovits.cfm.solver import euler_step, solve

__all__ = ["CFM", "DiT", "euler_step", "solve"]
