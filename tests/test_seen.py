"""What happened to a job before its placement, shown to its owner: the pin writes the job's past requeues and
refused pins into its tag (``seen=``), and ``migsub status`` shows them, without root."""

import time

from hypothesis import given
from hypothesis import strategies as st

from mig_batch.batch.fake import FakeBatch
from mig_batch.batch.tags import SEEN_MAX, NodeReport, Seen, parse_place, parse_seen, parse_tag, with_seen
from mig_batch.cli.migsub_status import status_row
from mig_batch.config import SiteConfig
from mig_batch.controller.daemon import Controller
from mig_batch.state import Store

RIGID = "mig-batch:v1;req=1g.10gb"


def test_a_requeued_jobs_next_pin_shows_its_owner_the_requeue_and_why(tmp_path):
    site = SiteConfig(state=tmp_path / "state.db", nodes={"n1": ("A100-80GB",), "n2": ("A100-80GB",)})
    store, batch = Store(site.state), FakeBatch(["n1", "n2"])
    c = Controller(site, store, batch)
    job = batch.add(RIGID)
    c.step()
    assert parse_seen(batch.job(job).admin_tag) == []  # a first placement shows nothing
    first = parse_place(batch.job(job).admin_tag).node
    batch.start(job, NodeReport("requeue", reason=f"decided spot taken; nothing fits on {first}"))
    c.step()
    batch._set(job, not_before=time.time() - 1)
    c.step()
    c.step()
    tag = batch.job(job).admin_tag
    assert parse_place(tag) is not None and parse_tag(tag) == parse_tag(RIGID)
    seen = parse_seen(tag)
    assert [s.kind for s in seen] == ["requeued"], tag
    assert "decided spot taken" in seen[0].detail and first in seen[0].detail
    row = status_row(job, "PENDING", "None", tag)
    assert row is not None and row["events"] == [vars(seen[0])] and row["placement"] is not None


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@given(events=st.lists(st.tuples(st.sampled_from(["requeued", "pin-refused", "replaced"]),
                                 st.integers(0, 2**40), _TEXT), max_size=9),
       head=st.sampled_from(["mig-batch:v1;req=1g.10gb;place=n1/0/1g.10gb@0",
                             "mig-batch:v1;req=3g;place=n2/1/3g.40gb@4;node=made:1/3g.40gb@4/2/MIG-x"]))  # fmt: skip
def test_a_tags_seen_field_reads_back_as_written_and_keeps_every_other_field(events, head):
    seen = [Seen(kind, float(t), detail) for kind, t, detail in events]
    text = with_seen(head, seen)
    back = parse_seen(text)
    assert [(s.kind, s.time) for s in back] == [(s.kind, s.time) for s in seen[-SEEN_MAX:]]
    assert all(";" not in s.detail and "," not in s.detail and "=" not in s.detail for s in back)
    assert parse_place(text) == parse_place(head) and parse_tag(text) == parse_tag(head)
    assert with_seen(text, []) == head or not seen
    assert with_seen(with_seen(text, seen), seen) == text  # written again: the same, once
