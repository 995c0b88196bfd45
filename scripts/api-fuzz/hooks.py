"""Schemathesis hooks for sluice: the rules of the API that OpenAPI cannot state, told to the
generator so that the data it calls valid is valid. Each is documented in the schema's
descriptions; nothing here loosens a check.

- `dedup_key` counts UTF-8 bytes (at most 256); JSON Schema's maxLength counts characters
  (in the admission's body and in the listing's filter).
- The listing's time filters name dates that exist (the pattern alone allows February 30).
- The `Idempotency-Key` header and the body's `dedup_key`, when both are sent, must be equal
  (else 400 `dedup_key_mismatch`), on an admission and on its dry run.
- A schedule (`run_at` or `delay`, on admission, its dry run and `.../reschedule`) is at most a year
  ahead; an admission names at most one of the two, a reschedule exactly one.

And one rule of the run itself: a valid `wait` on `GET /api/executions/{id}` holds the request
as long as it says when the execution stays queued (no worker runs here), and so does one on
the pull API's long polls (`POST /api/worker/lease`, `/api/worker/stops`) when nothing comes,
so waits that may be valid are sent as `1s`, in every generation mode (invalid ones still
answer at once, 400).

One check is the contract's own: `POST /api/executions/batch` answers an item that breaks the
rules of `NewExecution` (a `max_attempts` of 0, say) with that item's own 400 inside the
batch's 200, and admits the others. Schemathesis' negative-data check cannot see inside the
200, so schemathesis.toml lets that operation answer 200 to a negative case and
`batch_items_answered_alone` below holds the 200 to the rule instead: the batch itself is
well-formed, and every item that the schema rejects has a 4xx result of its own.
"""

import datetime
import re

import jsonschema_rs
import schemathesis
from schemathesis import GenerationMode


def _positive(case):
    meta = case.meta
    return meta is None or meta.generation.mode == GenerationMode.POSITIVE


def _real_date(value):
    """Whether an RFC 3339 time's date exists (the pattern allows February 30)."""
    try:
        datetime.date(int(value[0:4]), int(value[5:7]), int(value[8:10]))
        return True
    except (ValueError, TypeError):
        return False


def _valid_listing(case):
    query = case.query if isinstance(case.query, dict) else {}
    key = query.get("dedup_key")
    if isinstance(key, str) and len(key.encode("utf-8")) > 256:
        return False
    return all(
        _real_date(query[name])
        for name in ("created_from", "created_before")
        if isinstance(query.get(name), str)
    )


_YEAR_MS = 365 * 24 * 3600 * 1000
_DELAY = re.compile(r"^([0-9]{1,12})(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1_000, None: 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _valid_schedule(body, exactly_one):
    """Whether a body's `run_at`/`delay` is one the server accepts (at most a year ahead)."""
    run_at, delay = body.get("run_at"), body.get("delay")
    given = (run_at is not None) + (delay is not None)
    if given > 1 or (exactly_one and given == 0):
        return False
    if isinstance(delay, str):
        m = _DELAY.match(delay)
        if m and int(m.group(1)) * _UNIT_MS[m.group(2)] > _YEAR_MS:
            return False
    if isinstance(run_at, str):
        try:
            t = datetime.datetime.fromisoformat(run_at.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return True
        if t.tzinfo is None:
            return True
        ahead = t - datetime.datetime.now(datetime.timezone.utc)
        if ahead > datetime.timedelta(days=364):
            return False
    return True


@schemathesis.hook
def filter_case(context, case):
    if not _positive(case):
        return True
    if case.operation.method.upper() == "GET" and case.operation.path == "/api/executions":
        return _valid_listing(case)
    if case.operation.method.upper() == "POST" and case.operation.path.endswith("/reschedule"):
        body = case.body if isinstance(case.body, dict) else {}
        return _valid_schedule(body, exactly_one=True)
    admissions = ("/api/executions", "/api/executions/dry-run")
    if case.operation.method.upper() != "POST" or case.operation.path not in admissions:
        return True
    body = case.body if isinstance(case.body, dict) else {}
    if not _valid_schedule(body, exactly_one=False):
        return False
    body_key = body.get("dedup_key")
    header_key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(body_key, str) and len(body_key.encode("utf-8")) > 256:
        return False
    if isinstance(body_key, str) and isinstance(header_key, str) and body_key != header_key:
        return False
    return True


_WAIT = re.compile(r"^[0-9]+(ms|s|m)?$")


def _short_wait(case):
    # Any wait that may be valid, in every generation mode: a negative case can carry a valid
    # wait beside its invalid part, and the server may then hold it for as long as it says.
    long_polls = {
        ("GET", "/api/executions/{id}"),
        ("POST", "/api/worker/lease"),
        ("POST", "/api/worker/stops"),
    }
    if (
        (case.operation.method.upper(), case.operation.path) in long_polls
        and isinstance(case.query, dict)
        and isinstance(case.query.get("wait"), str)
        and _WAIT.match(case.query["wait"])
    ):
        case.query = {**case.query, "wait": "1s"}


@schemathesis.hook
def map_case(context, case):
    """In stateful sequences, `DELETE /api/executions/{id}` is the force delete.

    Without `force=true` that call is a cancel (the contract of docs/DESIGN.md): the execution stays
    readable, which Schemathesis' use-after-free check would take for a deleted resource still
    served. Only the force delete deletes, so sequences that delete use it and the check then
    holds the server to "gone means 404". The other phases still send both forms. Valid waits
    become `1s` (see the module docs).
    """
    meta = case.meta
    if (
        meta is not None
        and meta.phase.name == "stateful"
        and case.operation.method.upper() == "DELETE"
        and case.operation.path == "/api/executions/{id}"
    ):
        case.query = {**(case.query or {}), "force": "true"}
    _short_wait(case)
    return case


_VALIDATORS = {}


def _item_validator(raw_schema):
    """A validator of one batch item: `NewExecution`, its references resolved in the document
    (jsonschema_rs comes with Schemathesis).

    `format` is not asserted (the server's own rules for `run_at` are checked elsewhere), so an
    item called invalid here is invalid by a rule the schema states outright."""
    key = id(raw_schema)
    if key not in _VALIDATORS:
        root = {"components": raw_schema.get("components", {}),
                "$ref": "#/components/schemas/NewExecution"}
        _VALIDATORS[key] = jsonschema_rs.Draft202012Validator(root)
    return _VALIDATORS[key]


@schemathesis.check
def batch_items_answered_alone(ctx, response, case):
    """A 200 from the batch operation is a batch that is well-formed, whose every item that the
    schema rejects was answered alone with a 4xx (the schema of `NewBatch.items`: "An item that
    is not valid gets its own 400 result; the others are admitted")."""
    if (case.operation.method.upper(), case.operation.path) != ("POST", "/api/executions/batch"):
        return None
    if response.status_code != 200:
        return None
    body = case.body
    assert isinstance(body, dict) and set(body) == {"items"}, \
        "a body that is not exactly {items: [...]} was answered 200"
    items = body["items"]
    assert isinstance(items, list) and 1 <= len(items) <= 1000, \
        "a batch of no items or more than 1,000 was answered 200"
    results = response.json()["results"]
    assert len(results) == len(items), f"{len(items)} items, {len(results)} results"
    validator = _item_validator(case.operation.schema.raw_schema)
    for i, (item, result) in enumerate(zip(items, results)):
        error = next(iter(validator.iter_errors(item)), None)
        if error is not None:
            assert 400 <= result["status"] < 500, (
                f"item {i} breaks the schema ({error.message}) and was answered "
                f"{result['status']}, not a 4xx of its own"
            )
    return True
