"""Checkpoint staging from a Hugging Face hub (Gate A): pin, kit, stage, relay."""
