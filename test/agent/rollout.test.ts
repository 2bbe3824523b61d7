/**
 * The agent's side of a rollout (src/agent/rollout.ts): its group from the config or the label, the staleness of its
 * upgrader, the health it builds (bounded as the Proxy requires; a stale upgrader is a failing check that does not
 * make the agent unhealthy), and the reporter that sends a health only when it changed.
 */
import { describe, expect, it } from 'vitest';
import { agentUpgradeGroup, buildHealth, HealthReporter, upgraderStaleness, UPGRADER_CHECK } from '../../src/agent/rollout.js';
import { checkAgentHealth, type AgentHealth } from '../../src/wire/autoupdate.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import type { LastRun } from '../../src/upgrade/lastrun.js';

setRootLogger(createLogger({ level: 'silent' }));
const HOUR = 3_600_000;
const DAY = 24 * HOUR;

describe('agentUpgradeGroup', () => {
  it('takes the config, else the ssh_service label; a label that is not a name is no group, said', () => {
    expect(agentUpgradeGroup('prod', { 'upgrade-group': 'dev' })).toEqual({ group: 'prod' });
    expect(agentUpgradeGroup(undefined, { 'upgrade-group': 'dev' })).toEqual({ group: 'dev' });
    expect(agentUpgradeGroup(undefined, { env: 'x' })).toEqual({});
    expect(agentUpgradeGroup(undefined, undefined)).toEqual({});
    const bad = agentUpgradeGroup(undefined, { 'upgrade-group': 'Dev Group' });
    expect(bad.group).toBeUndefined();
    expect(bad.problem).toMatch(/not a group name/);
  });
});

describe('upgraderStaleness', () => {
  const at = (msAgo: number, now: number): LastRun => ({ at: Math.floor((now - msAgo) / 1000), result: 'up-to-date' });
  const now = Date.parse('2026-11-29T12:00:00Z');
  it('a recent run is not stale; one older than the age is, naming the timer', () => {
    expect(upgraderStaleness(at(HOUR, now), now - 2 * DAY, now, DAY).stale).toBe(false);
    const s = upgraderStaleness(at(DAY + HOUR, now), now - 2 * DAY, now, DAY);
    expect(s.stale).toBe(true);
    expect(s.detail).toMatch(/gateway-upgrade\.timer/);
  });
  it('no run: stale only once the agent has run that long', () => {
    expect(upgraderStaleness(undefined, now - HOUR, now, DAY).stale).toBe(false);
    expect(upgraderStaleness(undefined, now - DAY - 1, now, DAY)).toMatchObject({ stale: true, detail: expect.stringMatching(/no run of gateway-upgrade/) });
  });
});

describe('buildHealth', () => {
  const now = new Date('2026-11-29T12:00:00Z');
  it('a stale upgrader fails its own check and leaves ok to the serving checks', () => {
    const h = buildHealth([{ name: 'tunnel', ok: true, detail: '1 Proxy tunnel' }], { staleness: { stale: true, detail: 'old' }, lastRun: { at: 1, result: 'failed', code: 'GW_ERR_UPGRADE_HEALTH' } }, now);
    expect(h.ok).toBe(true);
    expect(h.checks.find((c) => c.name === UPGRADER_CHECK)).toEqual({ name: UPGRADER_CHECK, ok: false, detail: 'old' });
    expect(h.upgrader).toEqual({ result: 'failed', at: '1970-01-01T00:00:01.000Z', code: 'GW_ERR_UPGRADE_HEALTH' });
    expect(buildHealth([{ name: 'tunnel', ok: false, detail: 'no tunnel' }], {}, now).ok).toBe(false);
    expect(buildHealth([], {}, now).ok).toBe(false);
  });
  it('whatever the agent has (100 resources, long names and details), the Proxy takes it', () => {
    const many = Array.from({ length: 100 }, (_, i) => ({ name: `db ${'n'.repeat(100)}${i}`, ok: true, detail: 'd'.repeat(1000) }));
    const h = buildHealth(many, { staleness: { stale: false, detail: 'x'.repeat(500) } }, now);
    expect(checkAgentHealth(h, now.getTime()).ok).toBe(true);
  });
});

describe('HealthReporter', () => {
  it('sends the first measure and then only changes', async () => {
    const sent: AgentHealth[] = [];
    let tunnelOk = true;
    const r = new HealthReporter({ measure: async () => [{ name: 'tunnel', ok: tunnelOk }], send: (h) => sent.push(h), staleAfterMs: DAY, intervalMs: 60_000 });
    await r.tick();
    await r.tick();
    expect(sent).toHaveLength(1);
    tunnelOk = false;
    await r.tick();
    expect(sent).toHaveLength(2);
    expect(sent[1]!.ok).toBe(false);
    expect(r.current()).toBe(sent[1]);
  });

  it('with an upgrader: says when it turns stale, in the health', async () => {
    const sent: AgentHealth[] = [];
    let clock = Date.parse('2026-11-29T12:00:00Z');
    const r = new HealthReporter({ measure: async () => [{ name: 'tunnel', ok: true }], send: (h) => sent.push(h), readLastRun: () => undefined, staleAfterMs: DAY, intervalMs: 60_000, now: () => clock });
    await r.tick();
    expect(sent.at(-1)!.checks.find((c) => c.name === UPGRADER_CHECK)?.ok).toBe(true);
    clock += HOUR;
    await r.tick();
    expect(sent).toHaveLength(1); // nothing changed: nothing sent
    clock += DAY;
    await r.tick();
    expect(sent.at(-1)!.checks.find((c) => c.name === UPGRADER_CHECK)).toMatchObject({ ok: false, detail: expect.stringMatching(/gateway-upgrade\.timer/) });
    expect(sent.at(-1)!.ok).toBe(true);
  });
});

describe('gateway.upgrade_group', () => {
  it('is checked as a group name, with a hint', async () => {
    const { parseConfig } = await import('../../src/config/index.js');
    expect(parseConfig('gateway:\n  upgrade_group: prod-eu\n', 't').gateway.upgrade_group).toBe('prod-eu');
    expect(parseConfig('gateway:\n  nodename: a\n', 't').gateway.upgrade_stale_after).toBe(DAY);
    let err: { code?: string; message?: string; hint?: string } | undefined;
    try {
      parseConfig('gateway:\n  upgrade_group: Prod EU\n', 't');
    } catch (e) {
      err = e as typeof err;
    }
    expect(err?.code).toBe('GW_ERR_CONFIG_VALUE');
    expect(err?.message).toMatch(/gateway\.upgrade_group/);
    expect(err?.hint).toMatch(/lowercase letters/);
  });
});
