#!/usr/bin/env python3
"""Writes alerts_test.yaml: python3 gen_alerts_test.py alerts.yaml > alerts_test.yaml

The test cases (input series, evaluation times, which alerts fire with which labels) are written out
below by hand; only exp_annotations are rendered from alerts.yaml ({{ $labels.x }} substituted), so that
editing a runbook text needs no hand-copying. Annotations must not use $value (not rendered here).
After regenerating, run scripts/promtool-check.sh.
"""
import re, yaml, sys
rules = {r['alert']: r for g in yaml.safe_load(open(sys.argv[1]))['groups'] for r in g['rules']}
J = {'job': 'storeguard', 'instance': 'master-0:9529'}
def render(alert, labels):
    out = {}
    for k, v in rules[alert]['annotations'].items():
        out[k] = re.sub(r'\{\{ \$labels\.(\w+) \}\}', lambda m: labels[m.group(1)], v)
    return out
def exp(alert, **extra):
    labels = dict(J, **extra)
    labels['severity'] = rules[alert]['labels']['severity']
    return {'exp_labels': labels, 'exp_annotations': render(alert, labels)}
def S(name, values, **lab):
    l = dict(J, **lab)
    return {'series': '%s{%s}' % (name, ','.join('%s="%s"' % kv for kv in sorted(l.items()))), 'values': values}
tests = []
def T(comment, series, evals):
    tests.append({'interval': '1m', 'name': comment, 'input_series': series, 'alert_rule_test': [
        {'eval_time': t, 'alertname': a, 'exp_alerts': e} for t, a, e in evals]})
T('violations in enforce mode fire per rule; a quiet rule and a counter that stopped do not', [
    S('storeguard_violations_total', '0 0 1 3 3 3 3 3 3 3 3 3 3 3 3', rule='key_too_long', mode='enforce'),
    S('storeguard_violations_total', '0x14', rule='value_too_long', mode='enforce'),
    S('storeguard_violations_total', '0x14', rule='key_too_long', mode='monitor'),
], [('4m', 'StoreguardViolationsBlocked', [exp('StoreguardViolationsBlocked', rule='key_too_long')]),
    ('14m', 'StoreguardViolationsBlocked', []),
    ('4m', 'StoreguardViolationsWouldBlock', [])])
T('monitor-mode violations raise the info alert only', [
    S('storeguard_violations_total', '0 0 2 2 2 2', rule='unknown_opcode', mode='monitor'),
    S('storeguard_violations_total', '0x5', rule='unknown_opcode', mode='enforce'),
], [('3m', 'StoreguardViolationsWouldBlock', [exp('StoreguardViolationsWouldBlock', rule='unknown_opcode')]),
    ('3m', 'StoreguardViolationsBlocked', [])])
T('a pickle global denied fires critical in either mode, with its rule; other rules do not', [
    S('storeguard_violations_total', '0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1', rule='pickle_global_denied', mode='enforce'),
    S('storeguard_violations_total', '0 0 0 0 2 2 2 2 2 2 2 2 2 2 2 2', rule='rendezvous_state_invalid', mode='monitor'),
    S('storeguard_violations_total', '0 5 9 9 9 9 9 9 9 9 9 9 9 9 9 9', rule='key_too_long', mode='enforce'),
], [('1m', 'StoreguardPickleGlobalDenied', []),
    ('5m', 'StoreguardPickleGlobalDenied', [exp('StoreguardPickleGlobalDenied', rule='pickle_global_denied', mode='enforce'),
                                            exp('StoreguardPickleGlobalDenied', rule='rendezvous_state_invalid', mode='monitor')]),
    ('13m', 'StoreguardPickleGlobalDenied', [exp('StoreguardPickleGlobalDenied', rule='rendezvous_state_invalid', mode='monitor')])])
T('store quota refusals fire a warning per mode; other rules do not', [
    S('storeguard_violations_total', '0 0 3 3 3 3 3 3 3 3 3 3 3 3 3 3', rule='store_quota_exceeded', mode='enforce'),
    S('storeguard_violations_total', '0 5 9 9 9 9 9 9 9 9 9 9 9 9 9 9', rule='key_too_long', mode='enforce'),
], [('1m', 'StoreguardStoreQuotaExceeded', []),
    ('5m', 'StoreguardStoreQuotaExceeded', [exp('StoreguardStoreQuotaExceeded', mode='enforce')]),
    ('14m', 'StoreguardStoreQuotaExceeded', [])])
T('a ban fires once per instance, while new or active; clears after', [
    S('storeguard_bans_total', '0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'),
    S('storeguard_bans_active', '0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0'),
], [('1m', 'StoreguardSourceBanned', []),
    ('3m', 'StoreguardSourceBanned', [exp('StoreguardSourceBanned')]),
    ('16m', 'StoreguardSourceBanned', [exp('StoreguardSourceBanned')]),
    ('25m', 'StoreguardSourceBanned', [])])
T('a scan notice fires for 10m after it; none before', [
    S('storeguard_scans_detected_total', '0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'),
], [('2m', 'StoreguardScanDetected', []), ('4m', 'StoreguardScanDetected', [exp('StoreguardScanDetected')]),
    ('16m', 'StoreguardScanDetected', [])])
T('upstream dial failures: pending for 2m, then critical', [
    S('storeguard_upstream_dial_failures_total', '0 1 2 3 4 5 6 7 8'),
    S('storeguard_connections_active', '3x8'),
], [('1m', 'StoreguardUpstreamDialFailures', []),
    ('4m', 'StoreguardUpstreamDialFailures', [exp('StoreguardUpstreamDialFailures')]),
    ('8m', 'StoreguardNotReady', [])])
T('storeguard not scraped for 2m', [
    {'series': 'up{instance="master-0:9529",job="storeguard"}', 'values': '1 1 0 0 0 0 0'},
    {'series': 'up{instance="other:9100",job="node"}', 'values': '0 0 0 0 0 0 0'},
], [('3m', 'StoreguardDown', []),
    ('5m', 'StoreguardDown', [exp('StoreguardDown')])])
T('a storeguard found by annotations (any job name) that stops answering', [
    {'series': 'up{instance="10.1.2.3:9529",job="kubernetes-pods"}', 'values': '1 1 1 0 0 0 0'},
    {'series': 'storeguard_build_info{goversion="go1.26",instance="10.1.2.3:9529",job="kubernetes-pods",version="v0.1.0"}', 'values': '1 1 1 _ _ _ _'},
    {'series': 'up{instance="10.9.9.9:8080",job="kubernetes-pods"}', 'values': '0 0 0 0 0 0 0'},
], [('6m', 'StoreguardDown', [{'exp_labels': {'job': 'kubernetes-pods', 'instance': '10.1.2.3:9529', 'severity': 'critical'},
                              'exp_annotations': render('StoreguardDown', {'job': 'kubernetes-pods', 'instance': '10.1.2.3:9529'})}])])
T('not ready: failing dials and nothing connected for 10m', [
    S('storeguard_upstream_dial_failures_total', '0+1x20'),
    S('storeguard_connections_active', '0x20'),
], [('5m', 'StoreguardNotReady', []),
    ('12m', 'StoreguardNotReady', [exp('StoreguardNotReady')])])
T('a failed reload fires; successful reloads do not', [
    S('storeguard_config_reloads_total', '0 0 1 1 1', result='failed'),
    S('storeguard_config_reloads_total', '0 1 2 3 4', result='ok'),
], [('3m', 'StoreguardConfigReloadFailed', [exp('StoreguardConfigReloadFailed')])])
T('successful reloads alone are quiet', [
    S('storeguard_config_reloads_total', '0 1 2 3 4', result='ok'),
    S('storeguard_config_reloads_total', '0x4', result='failed'),
], [('3m', 'StoreguardConfigReloadFailed', [])])
T('a recovered panic is critical', [
    S('storeguard_panics_recovered_total', '0 0 1 1 1'),
], [('3m', 'StoreguardPanicsRecovered', [exp('StoreguardPanicsRecovered')]),
    ('1m', 'StoreguardPanicsRecovered', [])])
T('refusals above 1/s for 5m fire per reason; a trickle does not', [
    S('storeguard_connections_refused_total', '0+120x15', reason='source_rate'),
    S('storeguard_connections_refused_total', '0+10x15', reason='denied'),
], [('4m', 'StoreguardConnectionRefusalsSpike', []),
    ('12m', 'StoreguardConnectionRefusalsSpike', [exp('StoreguardConnectionRefusalsSpike', reason='source_rate')])])
T('clients closed for want of a store connection fire per reason; a flat counter is quiet', [
    S('storeguard_store_connections_refused_total', '0 0 1 1 1 1 1 1 1 1 1 1 1 1 1', reason='source_store_connections'),
    S('storeguard_store_connections_refused_total', '0x14', reason='max_store_connections'),
], [('1m', 'StoreguardStoreConnectionsRefused', []),
    ('3m', 'StoreguardStoreConnectionsRefused', [exp('StoreguardStoreConnectionsRefused', reason='source_store_connections')]),
    ('14m', 'StoreguardStoreConnectionsRefused', [])])
T('store connections near their cap for 5m fire; half the cap and no cap do not', [
    S('storeguard_store_connections', '850x10'),
    S('storeguard_store_connections_limit', '896x10'),
    S('storeguard_store_connections', '450x10', instance='master-1:9529'),
    S('storeguard_store_connections_limit', '896x10', instance='master-1:9529'),
    S('storeguard_store_connections', '5000x10', instance='master-2:9529'),
    S('storeguard_store_connections_limit', ' '.join(['+Inf'] * 11), instance='master-2:9529'),
], [('3m', 'StoreguardStoreConnectionsNearCap', []),
    ('7m', 'StoreguardStoreConnectionsNearCap', [exp('StoreguardStoreConnectionsNearCap')])])
T('audit write errors', [
    S('storeguard_audit_write_errors_total', '0 0 5 9 9'),
], [('3m', 'StoreguardAuditWriteErrors', [exp('StoreguardAuditWriteErrors')])])
T('log lines dropped; quiet while none are', [
    S('storeguard_log_lines_dropped_total', '0 0 0 4 4'),
], [('2m', 'StoreguardLogLinesDropped', []), ('4m', 'StoreguardLogLinesDropped', [exp('StoreguardLogLinesDropped')])])
T('a rendezvous round sending its ranks to an unguarded store fires for an hour; a flat counter is quiet', [
    S('storeguard_unguarded_job_stores_total', '0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'),
    S('storeguard_unguarded_job_stores_total', '0x70', instance='master-1:9529'),
], [('1m', 'StoreguardUnguardedJobStore', []),
    ('3m', 'StoreguardUnguardedJobStore', [exp('StoreguardUnguardedJobStore')]),
    ('65m', 'StoreguardUnguardedJobStore', [])])
T('a failed refresh of the peer set fires; ok refreshes are quiet, and a failure ages out after 10 minutes', [
    S('storeguard_peer_set_updates_total', '0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1', result='failed'),
    S('storeguard_peer_set_updates_total', '0+3x20', result='ok'),
], [('2m', 'StoreguardPeerSetFailing', []),
    ('4m', 'StoreguardPeerSetFailing', [exp('StoreguardPeerSetFailing')]),
    ('20m', 'StoreguardPeerSetFailing', [])])
missing = set(rules) - {e['alertname'] for t in tests for e in t['alert_rule_test'] if e['exp_alerts']}
assert not missing, missing
class D(yaml.SafeDumper): pass
D.add_representer(str, lambda d, s: d.represent_scalar('tag:yaml.org,2002:str', s, style='|' if '\n' in s else None))
print('# promtool unit tests for alerts.yaml: promtool test rules configs/prometheus/alerts_test.yaml')
print('# (scripts/promtool-check.sh runs it). Every alert has a firing case with its exact labels and')
print('# rendered annotations, and at least one case where it must stay quiet.')
print(yaml.dump({'rule_files': ['alerts.yaml'], 'evaluation_interval': '1m', 'tests': tests}, Dumper=D, sort_keys=False, width=200, default_flow_style=False), end='')
