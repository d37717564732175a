"""Workstation inputs: the private `.env`, parsed, validated and typed in one pass."""

from narwhal.deploy.inputs.destination import Destination
from narwhal.deploy.inputs.load import load_inputs, parse_inputs
from narwhal.deploy.inputs.model import EngineInputs, Inputs

__all__ = ["Destination", "EngineInputs", "Inputs", "load_inputs", "parse_inputs"]
