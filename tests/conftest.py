"""Every test's tier, assigned here and nowhere else (no test module marks its own).

- unit: no sockets, no subprocess, no real time. Enforced: a unit test that binds or connects a
  socket or starts a process fails, naming the line of this table to change.
- loopback: real servers on 127.0.0.1 or short subprocesses; fast, and right on a loaded host.
- realtime: depends on wall-clock pacing (simulators at real speed, a request held while another
  waits, timeouts of a fraction of a second to seconds); run apart, one at a time.
- bench: runs a benchmark end to end.
- faults: the fault-injection rows (tests/faults/): backends, clients and Redis as subprocesses
  that the rows kill, freeze and flood; minutes, not seconds, so run after the bench tier.
- engines: real inference engines (llama.cpp, vLLM's CPU build) that scripts/real-engines.sh
  builds and caches; skipped unless KVGATE_ENGINES is set (tests/engines/launch.py).

A test's tier is its entry in OVERRIDES (by test name, with or without its parameter id), else
its module's entry in MODULES, else the first rule of DEFAULTS whose prefix its module's name
starts with: a new or renamed module runs at once, by the rule for its name, until it is
measured (`pytest --durations=0`, and what it opens) and entered in MODULES.

Run one tier with `-m unit`, the fast ones with `-m "unit or loopback" -n 2`.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

TIERS = ("unit", "loopback", "realtime", "bench", "faults", "engines")  # in pyproject.toml

# Measured: what each module opens and how long it takes.
MODULES = {
    "test_bench_parse": "unit",
    "test_bench_cache_aware_live": "unit",
    "test_benchmarks_page": "unit",
    "test_body_worker": "unit",
    "test_cache_admin": "loopback",
    "test_cache_answer": "unit",
    "test_cache_dense_index": "unit",
    "test_cache_embed": "unit",
    "test_cache_embedders": "loopback",
    "test_cache_eval": "unit",
    "test_cache_guard": "unit",
    "test_config_reference": "unit",
    "test_cache_index": "unit",
    "test_cache_keys": "unit",
    "test_cache_live": "unit",
    "test_cache_response_cache": "unit",
    "test_cache_store": "loopback",
    "test_deploy_configs": "unit",
    "test_docs_pages": "unit",
    "test_engines_llamacpp": "engines",
    "test_engines_vllm": "engines",
    "test_fleetsim_cli": "unit",
    "test_routing_peers": "unit",
    "test_fleetsim_loop": "unit",
    "test_fleetsim_progress": "unit",
    "test_easy_hard": "unit",
    "test_small_model_shared_embedding": "loopback",
    "test_fleetsim_reservation": "unit",
    "test_fleetsim_snapshot": "unit",
    "test_fleetsim_trace": "unit",
    "test_fleetsim_trace_formats": "unit",
    "test_gateway_admission": "realtime",
    "test_gateway_api": "loopback",
    "test_gateway_auth": "loopback",
    "test_gateway_backend_state": "realtime",
    "test_gateway_cache": "loopback",
    "test_body_parse_worker": "loopback",
    "test_gateway_client_errors": "loopback",
    "test_gateway_loop_and_upload": "loopback",
    "test_gateway_client_log_redaction": "unit",
    "test_gateway_client_timeouts": "realtime",
    "test_gateway_config": "unit",
    "test_gateway_demo": "loopback",
    "test_readme_snippets": "loopback",
    "test_gateway_demo_process": "loopback",
    "test_gateway_demo_split": "bench",
    "test_gateway_disconnect": "realtime",
    "test_gateway_drain": "realtime",
    "test_gateway_drain_deploy": "unit",
    "test_gateway_errors": "unit",
    "test_gateway_first_token": "realtime",
    "test_gateway_health_outliers": "loopback",
    "test_gateway_learning": "realtime",
    "test_gateway_proxy": "loopback",
    "test_gateway_reservation": "realtime",
    "test_gateway_reservation_body": "unit",
    "test_gateway_ratelimit": "unit",
    "test_gateway_relay_errors": "unit",
    "test_gateway_relay_watch": "unit",
    "test_gateway_coalesce": "loopback",
    "test_gateway_coalesce_ticker": "unit",
    "test_gateway_gc_policy": "unit",
    "test_gateway_routing": "unit",
    "test_gateway_schemas": "unit",
    "test_gateway_serve": "loopback",
    "test_gateway_workers": "realtime",
    "test_gateway_workers_unit": "unit",
    "test_gateway_small_model": "loopback",
    "test_gateway_small_model_demo": "loopback",
    "test_gateway_small_model_request": "unit",
    "test_gateway_sse": "unit",
    "test_gateway_sse_fingerprint": "unit",
    "test_gateway_telemetry": "loopback",
    "test_gateway_upstream_errors": "loopback",
    "test_gateway_upstream_timeouts": "realtime",
    "test_faults_backends": "faults",
    "test_faults_clients": "faults",
    "test_faults_fuzz": "faults",
    "test_faults_openapi": "loopback",
    "test_faults_redis": "faults",
    "test_loadtest_benches": "bench",
    "test_loadtest_live_fleet": "bench",
    "test_loadtest_probe": "unit",
    "test_loadtest_split_frontier": "unit",
    "test_locust": "bench",
    "test_plan": "unit",
    "test_plan_fleet": "unit",
    "test_fidelity": "unit",
    "test_route_eval": "unit",
    "test_routing_admission": "unit",
    "test_routing_cost": "unit",
    "test_routing_cost_reservation": "unit",
    "test_routing_output_length": "unit",
    "test_routing_cycle": "unit",
    "test_routing_dispatch": "unit",
    "test_routing_fleet": "unit",
    "test_routing_kv_hold": "unit",
    "test_routing_speed_fleet": "unit",
    "test_routing_speed_pool": "unit",
    "test_routing_metrics_fast": "unit",
    "test_routing_metrics_engines": "unit",
    "test_routing_metrics_fixtures": "unit",
    "test_routing_metrics_group_cache": "unit",
    "test_routing_metrics_prom": "unit",
    "test_routing_metrics_synthetic": "unit",
    "test_routing_metrics_template": "unit",
    "test_routing_difficulty": "unit",
    "test_routing_difficulty_bench": "bench",
    "test_routing_difficulty_train": "realtime",
    "test_routing_model_select": "unit",
    "test_routing_offload": "unit",
    "test_routing_outlier": "unit",
    "test_routing_policies": "unit",
    "test_routing_policy": "unit",
    "test_routing_poller": "loopback",
    "test_routing_poller_filter": "loopback",
    "test_routing_poller_tiers": "loopback",
    "test_routing_prefix": "unit",
    "test_routing_retry_budget": "unit",
    "test_routing_probe": "unit",
    "test_routing_scorers": "unit",
    "test_routing_shared": "unit",
    "test_routing_scrape_client": "loopback",
    "test_routing_slo": "unit",
    "test_routing_stale": "unit",
    "test_routing_ttft": "unit",
    "test_sim_engine": "unit",
    "test_sim_exposition": "unit",
    "test_sim_exposition_formats": "unit",
    "test_sim_kvcache": "unit",
    "test_sim_min_tokens": "loopback",
    "test_sim_metrics_filter": "loopback",
    "test_sim_presets": "unit",
    "test_sim_server": "loopback",
    "test_sim_tokens": "unit",
    "test_structure": "unit",
    "test_telemetry_accesslog": "unit",
    "test_telemetry_histograms": "unit",
    "test_telemetry_metrics": "unit",
    "test_telemetry_prometheus": "unit",
    "test_telemetry_settings": "unit",
    "test_telemetry_timing": "unit",
    "test_telemetry_tracing": "unit",
    "test_tiers": "unit",
    "test_top": "unit",
    "test_workloads": "unit",
}

# Tests whose tier is not their module's, as "module::test" or "module::test[param id]".
OVERRIDES = {
    "test_cache_admin::test_a_redis_url_it_cannot_read_exits_2": "unit",
    "test_cache_embed::test_vectors_are_the_same_in_every_process": "loopback",
    "test_cache_response_cache::test_a_hanging_store_costs_one_timeout_then_a_cooldown":
        "realtime",
    "test_cache_store::test_store[redis-an entry is gone after its ttl]": "realtime",
    "test_cache_store::test_memory_evicts_the_least_recently_used_past_max_entries": "unit",
    "test_cache_store::test_memory_recency": "unit",
    "test_cache_store::test_memory_ttl_counts_from_the_put_on_the_injected_clock": "unit",
    "test_cache_store::test_memory_forgets_expired_and_evicted_entries_whole": "unit",
    "test_cache_store::test_memory_refuses_bad_limits": "unit",
    "test_cache_store::test_redis_refuses_bad_limits": "unit",
    # matplotlib builds its font cache on a fresh machine by running fc-list.
    "test_fleetsim_cli::test_plot_writes_a_png_or_names_the_missing_extra": "loopback",
    "test_fleetsim_cli::test_results_do_not_depend_on_the_process_hash_seed": "loopback",
    "test_gateway_admission::test_tenant": "unit",
    "test_gateway_admission::test_two_keys_are_two_tenants_and_one_key_is_one": "unit",
    "test_gateway_admission::test_priority": "unit",
    "test_gateway_admission::test_a_priority_that_is_not_a_sane_integer_is_rejected": "unit",
    "test_gateway_admission::test_what_the_model_reads": "unit",
    "test_gateway_auth::test_bad_keys_stop_the_gateway_at_start_naming_the_field": "unit",
    "test_gateway_cache::test_cache_control_directives_are_read": "unit",
    "test_gateway_cache::test_identical_whole_requests_in_flight_ask_the_backend_once":
        "realtime",
    "test_gateway_cache::test_a_stream_does_not_wait_for_an_identical_request_in_flight":
        "realtime",
    "test_gateway_cache::test_an_identical_stream_follows_one_in_flight_as_its_text_comes":
        "realtime",
    "test_gateway_proxy::test_when_every_backend_is_silent_the_client_gets_504_after_one_retry":
        "realtime",
    "test_gateway_ratelimit::test_a_key_over_its_rpm_gets_429_with_retry_after_and_other_keys"
    "_do_not": "loopback",
    "test_gateway_ratelimit::test_a_key_over_its_tpm_gets_429_and_a_cache_hit_is_not_charged":
        "loopback",
    "test_gateway_ratelimit::test_a_request_is_settled_on_its_usage_so_a_short_answer_frees_its"
    "_estimate": "loopback",
    "test_gateway_routing::test_long_context_requests_avoid_the_backend_near_kv_exhaustion_short"
    "_ones_still_use_it": "realtime",
    "test_gateway_routing::test_with_the_fleet_saturated_requests_wait_at_the_gateway_and_nothing"
    "_is_lost": "realtime",
    "test_gateway_small_model::test_overflow_sends_an_easy_request_the_large_model_refuses_to_the"
    "_small_one": "realtime",
    "test_gateway_telemetry::test_through_a_saturated_gateway_ttft_contains_the_queue_and_every"
    "_request_counts_once": "realtime",
    "test_gateway_telemetry::test_the_telemetry_section_maps_onto_the_telemetry_settings": "unit",
    "test_gateway_telemetry::test_a_bad_telemetry_setting_fails_at_start_naming_it": "unit",
    "test_gateway_telemetry::test_access_lines_are_written_in_one_call_once_the_batch_is_full":
        "unit",
    "test_gateway_telemetry::test_a_pending_access_line_is_written_within_the_delay": "realtime",
    "test_gateway_telemetry::test_the_cli_sends_access_lines_to_their_own_handler_at_the_chosen"
    "_level": "unit",
    "test_loadtest_live_fleet::test_bad_usage_exits_2": "unit",
    "test_loadtest_split_frontier::test_the_same_command_gives_the_same_numbers": "bench",
    "test_routing_difficulty_train::test_the_eval_split_routes_within_the_targets": "unit",
    "test_routing_poller::test_a_hanging_backend_does_not_delay_the_others": "realtime",
    "test_routing_poller::test_a_scrape_past_its_timeout_is_a_failure_that_leaves_health_alone":
        "realtime",
    "test_routing_poller::test_backends_whose_scrapes_fail_are_probed_with_exponential_backoff":
        "unit",
    "test_routing_poller::test_a_restamped_snapshot_differs_only_in_its_time": "unit",
    "test_routing_prefix::test_chain_hashes_do_not_depend_on_the_process": "loopback",
    "test_sim_exposition_formats::test_the_poller_reads_a_simulated_tgi_with_its_batch_budget":
        "loopback",
    "test_sim_exposition_formats::test_the_poller_reads_a_simulated_llamacpp_with_kv_from_its"
    "_slots": "loopback",
    "test_sim_exposition_formats::test_a_llamacpp_configured_with_unified_kv_takes_one_slots"
    "_context_as_capacity": "loopback",
    "test_sim_exposition_formats::test_slots_is_not_found_on_other_servers": "loopback",
    "test_sim_exposition_formats::test_a_fresh_tgi_is_healthy_and_idle_for_the_poller_when"
    "_configured": "loopback",
    "test_sim_server::test_invalid_settings_are_refused_before_serving": "unit",
    "test_sim_server::test_client_disconnect_mid_stream_aborts_the_request": "realtime",
    "test_sim_server::test_client_disconnect_aborts_a_non_streaming_request": "realtime",
    "test_top::test_top_once_renders_the_fleet_and_the_request_figures": "loopback",
    "test_top::test_piped_without_a_width_no_column_is_cut": "loopback",
    "test_top::test_top_once_waits_for_a_gateway_slower_than_its_refresh_period": "loopback",
    "test_top::test_top_once_fails_with_one_line_when_the_gateway_is_unreachable": "loopback",
    "test_top::test_bad_options_exit_2_naming_the_option": "loopback",
}

# A module in neither table: the first rule whose prefix its name starts with. Unguarded (a
# guess is not a measurement), so a new module of real servers under a unit prefix still runs.
DEFAULTS = (
    ("test_bench_", "bench"),
    ("test_loadtest_bench", "bench"),
    ("test_engines_", "engines"),
    ("test_routing_", "unit"),
    ("test_telemetry_", "unit"),
    ("test_fleetsim_", "unit"),
    ("test_faults_", "faults"),
    ("", "loopback"),
)

MEASURED_UNIT = pytest.StashKey[bool]()  # the tier is unit, and from a measured entry


def tier_of(module: str, name: str, original: str) -> tuple[str, bool]:
    """The tier of test `name` (its function `original`) in `module`, and whether it was
    measured (an entry of OVERRIDES or MODULES) rather than guessed from the module's name."""
    for key in (f"{module}::{name}", f"{module}::{original}"):
        if key in OVERRIDES:
            return OVERRIDES[key], True
    if module in MODULES:
        return MODULES[module], True
    return next(tier for prefix, tier in DEFAULTS if module.startswith(prefix)), False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if own := [m.name for m in item.iter_markers() if m.name in TIERS]:
            raise pytest.UsageError(f"{item.nodeid} marks itself {own}: tiers are assigned in"
                                    " tests/conftest.py only")
        module = item.path.stem
        original = getattr(item, "originalname", item.name)
        tier, measured = tier_of(module, item.name, original)
        item.add_marker(getattr(pytest.mark, tier))
        item.stash[MEASURED_UNIT] = tier == "unit" and measured


@pytest.fixture(autouse=True)
def unit_opens_nothing(request: pytest.FixtureRequest,
                       monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A test tiered unit that binds or connects a socket, or starts a process, fails."""
    if request.node.stash.get(MEASURED_UNIT, False):
        module, name = request.node.path.stem, request.node.name

        def refuse(*_: Any, **__: Any) -> NoReturn:
            raise AssertionError(
                f"{module}::{name} is tiered unit but opens a socket or a process: give it"
                " the loopback tier in tests/conftest.py (OVERRIDES or MODULES)")

        for method in ("bind", "connect", "connect_ex"):
            monkeypatch.setattr(socket.socket, method, refuse)
        monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    yield


# Tests write to their own temporary directories, never into the repository: two workers would
# race on the file, and a benchmark's recorded figures would be replaced by a test's small run.
RESULTS = Path(__file__).resolve().parents[1] / "loadtest" / "results"
RESULTS_BEFORE = pytest.StashKey[dict[str, int]]()


def results_files() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in RESULTS.glob("*") if p.is_file()}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.stash[RESULTS_BEFORE] = results_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.stash.get(RESULTS_BEFORE, None)
    if before is None or hasattr(session.config, "workerinput"):  # the controller checks
        return
    after = results_files()
    if changed := sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n)):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.ensure_newline()
        reporter.write_sep("!", f"tests wrote into {RESULTS}: {', '.join(changed)} (give the"
                           " benchmark a temporary directory, or --no-record)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
