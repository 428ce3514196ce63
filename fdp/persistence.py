"""An accountant as JSON: the composed mechanisms and the settings, no pickles.

The document is ``{"format": "fdp.PLDAccountant/1", <settings>, "events":
[{"mechanism": <Mechanism.to_dict()>, "steps": n}, ...]}``; reading it back refuses,
with a ValueError saying what is wrong and where, anything else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from fdp._validation import format_value
from fdp.mechanisms.base import mechanism_from_dict

__all__ = ["FORMAT", "accountant_from_json", "accountant_to_json"]

#: The document's format tag.
FORMAT = "fdp.PLDAccountant/1"


def accountant_to_json(accountant: Any, settings: Sequence[str]) -> str:
    """``accountant``'s ``settings`` and events as a JSON document."""
    return json.dumps({
        "format": FORMAT,
        **{name: getattr(accountant, name) for name in settings},
        "events": [{"mechanism": m.to_dict(), "steps": c} for m, c in accountant.events],
    })


def accountant_from_json(cls: Any, text: str, settings: Sequence[str]) -> Any:
    """A new ``cls`` accountant with the settings and events of a document."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as err:  # not a str, or not JSON (JSONDecodeError)
        raise ValueError(f"text must be a JSON document (str); {err}") from None
    except RecursionError:  # brackets nested thousands deep: no accountant writes that
        raise ValueError("text must be a JSON document nested less deeply than Python's "
                         f"recursion limit ({sys.getrecursionlimit()}); an fdp document is a few levels deep") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = f"format={data.get('format')!r}" if isinstance(data, dict) else format_value(data)
        raise ValueError(f'not an fdp.PLDAccountant JSON document (an object with "format": '
                         f'"{FORMAT}"); got {got}')
    unknown = sorted(set(data) - {"format", "events", *settings})
    if unknown:
        raise ValueError(f'unknown keys {unknown}: the document holds "format", "events" and {list(settings)}')
    events = data.get("events")
    if not isinstance(events, list):
        raise ValueError(f'"events" must be a list of {{"mechanism": ..., "steps": ...}}; got {format_value(events)}')
    acc = cls(**{name: data[name] for name in settings if name in data})
    for i, ev in enumerate(events):
        try:
            if not isinstance(ev, dict) or set(ev) != {"mechanism", "steps"}:
                raise ValueError(f'must be an object with the keys "mechanism" and "steps"; got {format_value(ev)}')
            acc.compose(mechanism_from_dict(ev["mechanism"]), steps=ev["steps"])
        except ValueError as err:
            raise ValueError(f"events[{i}]: {err}") from None
        except RecursionError:
            raise ValueError(f"events[{i}]: the mechanism is nested too deeply") from None
    return acc
