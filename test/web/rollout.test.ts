/**
 * The agents page's rollout panel logic (web/src/lib/rollout.ts): states to badges, the next start in a group's own
 * time zone, versions counted, what is shown first (rollback, halted groups, suspension, stale agents), and the
 * hostile cases of a status the page is handed (unknown states and zones, huge lists and texts, wrong types).
 */
import { describe, expect, it } from 'vitest';
import type { RolloutStatus as WireStatus } from '../../src/wire/autoupdate.js';
import { canaryBadge, capped, clip, groupBadge, inZone, MAX_LISTED, MAX_TEXT, rolloutAlerts, rolloutSubtitle, rolloutSummary, shownGroups, versionCounts } from '../../web/src/lib/rollout.js';
import type { RolloutStatus } from '../../web/src/types.js';

// The page's copy of the contract and the contract stay assignable both ways (a change to one fails the type check).
const toPage = (s: WireStatus): RolloutStatus => s;
const toWire = (s: RolloutStatus): WireStatus => s;

const NOW = Date.parse('2026-11-29T10:00:00Z');

const status = (over: Partial<RolloutStatus> = {}): RolloutStatus =>
  toPage(
    toWire({
      managed: true,
      mode: 'enabled',
      strategy: 'halt-on-error',
      start_version: '17.0.0',
      target_version: '17.0.1',
      groups: [
        { name: 'dev', state: 'done', reason: 'every agent runs 17.0.1', canaries: [], versions: { '17.0.1': 4 }, stale: [] },
        { name: 'staging', state: 'halted', reason: 'canary stg-1 failed its health check: db orders did not answer', canaries: [{ host_id: 'h', nodename: 'stg-1', state: 'failed' }], versions: { '17.0.0': 3, '17.0.1': 1 }, stale: [] },
        { name: 'prod', state: 'unstarted', reason: 'waits for staging', next_start: '2026-11-30T01:00:00Z', time_zone: 'Europe/Berlin', canaries: [], versions: { '17.0.0': 4 }, stale: [{ host_id: 'p', nodename: 'prod-4', last_run: '2026-11-20T00:00:00Z' }] },
      ],
      ...over,
    }),
  );

describe('the rollout panel', () => {
  it('maps group and canary states to badges; an unknown state is neutral and shown as sent, cut', () => {
    expect(groupBadge('halted')).toEqual({ kind: 'bad', text: 'halted' });
    expect(groupBadge('done')).toEqual({ kind: 'ok', text: 'done' });
    expect(groupBadge('rolledback')).toEqual({ kind: 'warn', text: 'rolled back' });
    expect(groupBadge('exploded')).toEqual({ kind: 'neutral', text: 'exploded' });
    expect(groupBadge('toString')).toEqual({ kind: 'neutral', text: 'toString' }); // not a key of the table's prototype
    expect(groupBadge(undefined)).toEqual({ kind: 'neutral', text: 'unknown' });
    expect(groupBadge('x'.repeat(1000)).text.length).toBeLessThanOrEqual(32);
    expect(canaryBadge('failed')).toBe('bad');
    expect(canaryBadge('healthy')).toBe('ok');
    expect(canaryBadge('__proto__')).toBe('neutral');
  });

  it("shows the next start in the group's own time zone, and says so when the zone is unknown", () => {
    // 01:00 UTC is 02:00 in Berlin in winter.
    expect(inZone('2026-11-30T01:00:00Z', 'Europe/Berlin', NOW)).toBe('Mon, 30/11/2026, 02:00 Europe/Berlin (in 15 h)');
    expect(inZone('2026-11-30T01:00:00Z', 'America/New_York', NOW)).toContain('20:00 America/New_York');
    expect(inZone('2026-11-30T01:00:00Z', undefined, NOW)).toBe('Mon 2026-11-30 01:00 UTC (in 15 h)');
    expect(inZone('2026-11-30T01:00:00Z', 'Mars/Olympus', NOW)).toBe('Mon 2026-11-30 01:00 UTC (in 15 h; unknown time zone Mars/Olympus)');
    expect(inZone('not a date', 'UTC', NOW)).toBe('—');
    expect(inZone(undefined, 'UTC', NOW)).toBe('—');
  });

  it('counts versions most agents first, and drops what is not a count', () => {
    expect(versionCounts({ '17.0.0': 3, '17.0.1': 5 })).toEqual([['17.0.1', 5], ['17.0.0', 3]]);
    expect(versionCounts({ a: 1, b: 'x', c: -1, d: NaN, e: 2.7 })).toEqual([['e', 2], ['a', 1]]);
    expect(versionCounts(null)).toEqual([]);
    expect(versionCounts(Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`1.0.${i}`, 1])))).toHaveLength(MAX_LISTED);
  });

  it('shows first what needs an operator: the rollback, halted groups with their reason, stale agents', () => {
    const alerts = rolloutAlerts(status({ rollback: { since: '2026-11-29T09:00:00Z', now: false } }));
    expect(alerts.map((a) => a.testid)).toEqual(['rollout-rollback', 'rollout-halted-staging', 'rollout-stale']);
    expect(alerts[0]!.text).toBe('Rollback in progress since Sun 2026-11-29 09:00 UTC: the whole fleet goes back to 17.0.0 through the windows and canaries.');
    expect(alerts[1]!.text).toBe('Group staging halted: canary stg-1 failed its health check: db orders did not answer');
    expect(rolloutAlerts(status({ rollback: { since: '2026-11-29T09:00:00Z', now: true, group: 'prod' } }))[0]!.text).toContain('group prod goes back to 17.0.0 at once (--now)');
    expect(rolloutAlerts(status({ mode: 'suspended', groups: [] })).map((a) => a.testid)).toEqual(['rollout-suspended']);
    expect(rolloutAlerts(status({ groups: [] }))).toEqual([]);
    const two = status().groups.map((g) => ({ ...g, stale: [{ host_id: 'x', nodename: 'x' }] }));
    expect(rolloutAlerts(status({ groups: two })).find((a) => a.testid === 'rollout-stale')!.text).toBe('3 agents have not run their upgrader for too long: they will not upgrade until it runs again.');
    expect(alerts[2]!.text).toBe('1 agent has not run its upgrader for too long: it will not upgrade until the upgrader runs again.');
  });

  it('summarizes the versions, the strategy and the groups; no target says nothing upgrades', () => {
    expect(rolloutSummary(status())).toBe('17.0.0 → 17.0.1, halt-on-error, 3 groups');
    expect(rolloutSummary(status({ target_version: undefined, groups: [], ungrouped: 2 }))).toBe('no target version set: nothing upgrades, halt-on-error, 0 groups, 2 agents in no group');
  });

  it("the page's subtitle says the rollout decides while it is managed and not disabled; otherwise the window does", () => {
    expect(rolloutSubtitle(status())).toContain('Upgrades follow the managed rollout below');
    expect(rolloutSubtitle(status({ mode: 'suspended' }))).toContain('Upgrades follow the managed rollout below');
    expect(rolloutSubtitle(status({ mode: 'disabled' }))).toBeUndefined();
    expect(rolloutSubtitle({ managed: false, groups: [] })).toBeUndefined();
    expect(rolloutSubtitle(undefined)).toBeUndefined();
    expect(rolloutSubtitle({ managed: 'yes', groups: [] } as unknown as RolloutStatus)).toBeUndefined();
  });

  it('hostile statuses: huge lists and texts are capped, wrong types do not throw', () => {
    const many = Array.from({ length: 5000 }, (_, i) => ({ host_id: `h${i}`, nodename: `n${i}` }));
    expect(capped(many)).toMatchObject({ more: 5000 - MAX_LISTED });
    expect(capped(many).shown).toHaveLength(MAX_LISTED);
    expect(capped('nope')).toEqual({ shown: [], more: 0 });
    expect(clip('y'.repeat(10_000))).toHaveLength(MAX_TEXT);
    expect(clip(42)).toBe('42');
    expect(shownGroups({ managed: true, groups: 'x' } as unknown as RolloutStatus)).toEqual([]);
    expect(shownGroups({ managed: true, groups: Array.from({ length: 1000 }, () => status().groups[0]!) }).length).toBe(50);
    expect(rolloutAlerts({ managed: true, groups: null } as unknown as RolloutStatus)).toEqual([]);
  });
});
