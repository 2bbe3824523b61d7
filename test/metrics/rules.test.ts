/**
 * The alerting rules shipped in deploy/prometheus/: promtool (Debian's prometheus package) checks them and runs
 * their unit tests (deploy/prometheus/tests/*.yaml: series in, alerts expected out), and every metric a rule
 * reads is one the gateway exports (declared in src/metrics/), so a renamed metric cannot leave a rule silently
 * matching nothing.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DECLARED } from '../../src/metrics/catalog.js';
import { promtoolTestRules } from '../helpers/prometheus.js';

const DIR = new URL('../../deploy/prometheus/', import.meta.url).pathname;
const RULES = join(DIR, 'gateway-rules.yaml');

describe('deploy/prometheus/gateway-rules.yaml', () => {
  it('passes promtool check rules', () => {
    const r = spawnSync('promtool', ['check', 'rules', RULES], { encoding: 'utf8', timeout: 60_000 });
    expect(r.status, `${r.stdout}${r.stderr}`).toBe(0);
  });

  it('passes its unit tests (promtool test rules)', () => {
    const tests = readdirSync(join(DIR, 'tests')).filter((f) => f.endsWith('.yaml')).map((f) => join(DIR, 'tests', f));
    expect(tests.length).toBeGreaterThan(0);
    const r = promtoolTestRules(tests);
    expect(r.status, r.output).toBe(0);
  });

  it('reads only metrics the gateway exports, and has the alerts the docs promise', () => {
    const text = readFileSync(RULES, 'utf8');
    const exprs = [...text.matchAll(/expr: (\|\n(?:\s{10}.*\n)+|.*)/g)].map((m) => m[1]!);
    const names = new Set(exprs.flatMap((e) => [...e.matchAll(/\b(gateway_[a-z_]+)\b/g)].map((m) => m[1]!)));
    expect(names.size).toBeGreaterThan(5);
    const declared = new Set(DECLARED.map((d) => d.name));
    const base = (n: string) => n.replace(/_(bucket|sum|count)$/, '');
    expect([...names].filter((n) => !declared.has(base(n)))).toEqual([]);
    for (const alert of ['GatewayAgentTunnelDown', 'GatewayCertificateExpiringSoon', 'GatewayUpgradeFailed', 'GatewayKubeUpdaterFailed', 'GatewayPeerUnreachable', 'GatewayRolloutHalted', 'GatewayRolloutStaleAgents']) expect(text).toContain(`alert: ${alert}`);
  });
});
