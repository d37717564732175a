"""`python -m tests.component.lab.hub_card_probe REPO...`: load each repo's model card with
`huggingface_hub.ModelCard.load`, which takes no endpoint argument, so this runs in its own
process with only `HF_ENDPOINT` pointing at the hub double, as an operator's shell would.
Prints one JSON object: the card's fields per repo, or the exception's class name."""

from __future__ import annotations

import json
import sys

from huggingface_hub import ModelCard


def _probe(repo_id: str) -> dict[str, object]:
    try:
        card = ModelCard.load(repo_id)
    except Exception as exc:  # the exception's class is the answer
        return {"error": type(exc).__name__}
    return {"license": card.data.license, "base_model": card.data.base_model,
            "pipeline_tag": card.data.pipeline_tag, "text": card.text.strip()}


if __name__ == "__main__":
    print(json.dumps({repo: _probe(repo) for repo in sys.argv[1:]}))
