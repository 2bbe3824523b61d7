/**
 * The managed rollout on the Auth Service (src/auth/rollout/): each group's state as a one-hot gauge, its stale
 * agents (whose upgrader has not run for stale_after), and the halts. The group label is bounded by the
 * autoupdate_config itself (at most 16 groups, each named [a-z0-9-]{1,32}), and the state by the closed set of
 * src/wire/autoupdate.ts. Set from the controller's last status, read at each scrape.
 */
import { counter, gauge, type PatternSet } from './define.js';

const AREA = 'managed rollouts';
/** src/wire/autoupdate.ts's GroupState (a leaf may not import the wire: the Auth Service passes its status in). */
export const GROUP_STATES = ['unstarted', 'canary', 'active', 'done', 'halted', 'rolledback'] as const;

/** What the gauges read of the rollout's status (RolloutStatus, src/wire/autoupdate.ts). */
export interface RolloutGauges {
  groups: ReadonlyArray<{ name: string; state: string; stale: readonly unknown[] }>;
}
const GROUP: PatternSet = { pattern: /^[a-z0-9-]{1,32}$/, max: 16, what: "a rollout group's name (autoupdate_config declares at most 16)" };

let last: RolloutGauges | undefined;

const groupState = gauge({
  name: 'gateway_autoupdate_group_state',
  help: "Each rollout group's state (1 for the state it is in, 0 for the others); absent while no rollout is set.",
  area: AREA,
  labels: { group: GROUP, state: GROUP_STATES },
  collect: () => collect(),
});
const stale = gauge({ name: 'gateway_autoupdate_stale_agents', help: "Connected agents of a group whose upgrader has not run for stale_after (they never upgrade until it runs).", area: AREA, labels: { group: GROUP } });
const halts = counter({ name: 'gateway_autoupdate_halts_total', help: 'Groups halted by a failed canary, counted by the Auth Service that stepped the rollout.', area: AREA });

function collect(): void {
  groupState.metric.reset();
  stale.metric.reset();
  for (const g of last?.groups ?? []) {
    for (const s of GROUP_STATES) groupState.set({ group: g.name, state: s }, g.state === s ? 1 : 0);
    stale.set({ group: g.name }, g.stale.length);
  }
}

/** The controller's newest status, shown at the next scrape. */
export function recordRolloutStatus(status: RolloutGauges | undefined): void {
  last = status;
}

export function recordRolloutHalt(): void {
  halts.inc({} as Record<never, string>);
}
