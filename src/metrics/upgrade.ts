/**
 * Upgrade state on an agent: its running version, the target and the channel its upgrader last saw (an info-style
 * gauge, always 1), the start of the next maintenance window the agent exported (Unix seconds; 0 when the cluster
 * has none), and the upgrader's last run: its result as a one-hot gauge and when it ran. The versions and the
 * channel are bounded by pattern and cap (define.ts), the result is the upgrader's closed set.
 *
 * The upgrader (gateway-upgrade, a timer's process) writes its last run to a file (src/upgrade/lastrun.ts); the
 * agent registers a reader of it, read at each scrape.
 *
 * The Kubernetes updater (gateway-kube-updater, a long-running controller) has no agent beside it to read a file:
 * it serves its own /metrics (its --diag-addr) with its last reconciliation's result, in the same closed set, and
 * the decision's reason (decide.ts's closed set, or `error` when the run failed before deciding).
 */
import { gauge, VERSION_SET, type PatternSet } from './define.js';

/** up-to-date, waiting (outside a window), upgraded, failed; unknown: no run recorded yet. */
export const UPGRADE_RESULTS = ['up-to-date', 'no-version', 'waiting', 'upgraded', 'failed', 'unknown'] as const;
const CHANNEL: PatternSet = { pattern: /^[a-z0-9][a-z0-9._/-]{0,63}$/, max: 8, what: 'an upgrade channel (default, stable/v17, stable/rolling ...), at most 8' };

export interface UpgradeState {
  current: string;
  channel: string;
  /** What the upgrader last saw. */
  lastRun?: { result: string; at: number; target?: string } | undefined;
}

const AREA = 'upgrades';
const sources = new Set<() => UpgradeState>();
const info = gauge({
  name: 'gateway_agent_upgrade_info',
  help: "An agent's running version (current), the version its upgrader last saw as the target (unknown before a run) and its channel; always 1.",
  area: AREA,
  labels: { current: VERSION_SET, target: { ...VERSION_SET, what: 'a version (x.y.z[-pre], none, or unknown before a run), at most 16', pattern: /^(?:unknown|none|[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(?:-[0-9A-Za-z.]{1,32})?)$/ }, channel: CHANNEL },
  collect: () => collectUpgrade(),
});
const result = gauge({ name: 'gateway_agent_upgrade_last_result', help: "The result of the upgrader's last run (1 for the result it had, 0 for the others).", area: AREA, labels: { result: UPGRADE_RESULTS } });
const lastRun = gauge({ name: 'gateway_agent_upgrade_last_run_timestamp_seconds', help: "When the upgrader last ran (Unix seconds), with its result; absent before a run.", area: AREA, labels: { result: UPGRADE_RESULTS } });
const nextWindow = gauge({
  name: 'gateway_agent_upgrade_next_window_timestamp_seconds',
  help: 'Start of the next maintenance window the agent exported for its upgrader (Unix seconds; 0: the cluster has none).',
  area: AREA,
  labels: { upgrader: ['systemd', 'kubernetes'] },
});

function collectUpgrade(): void {
  info.metric.reset();
  result.metric.reset();
  lastRun.metric.reset();
  for (const read of sources) {
    const s = read();
    info.set({ current: s.current, target: s.lastRun?.target ?? 'unknown', channel: s.channel }, 1);
    for (const r of UPGRADE_RESULTS) result.set({ result: r }, (s.lastRun?.result ?? 'unknown') === r ? 1 : 0);
    if (s.lastRun) lastRun.set({ result: s.lastRun.result }, s.lastRun.at);
  }
}

/** An agent's upgrade state, read at each scrape. Returns the unregister. */
export function watchUpgrade(read: () => UpgradeState): () => void {
  sources.add(read);
  return () => sources.delete(read);
}

/** The agent exported its schedule for upgrader: the next window's start (undefined: none). */
export function recordNextWindow(upgrader: 'systemd' | 'kubernetes', start: Date | undefined): void {
  nextWindow.set({ upgrader }, start ? Math.floor(start.getTime() / 1000) : 0);
}

/**
 * decide.ts's decision reasons (update: in-window, critical, and a managed rollout's rollout, rollback; skip: the
 * others, rollout-waiting, instruction-unreadable and unsafe-version the rollout's), and error: no decision was made.
 */
export const KUBE_UPDATER_REASONS = [
  'in-window',
  'critical',
  'rollout',
  'rollback',
  'suspended',
  'no-container',
  'unknown-current',
  'no-target',
  'no-new-version',
  'no-schedule',
  'outside-window',
  'rollout-waiting',
  'instruction-unreadable',
  'unsafe-version',
  'error',
] as const;
/** The upgraders' set, and rolled-back: a managed rollout moved the release to a lower version (decide.ts). */
export const KUBE_UPDATER_RESULTS = [...UPGRADE_RESULTS, 'rolled-back'] as const;
const kubeResult = gauge({ name: 'gateway_kube_updater_last_result', help: "The result of the Kubernetes updater's last reconciliation (1 for the result it had, 0 for the others; absent before one).", area: AREA, labels: { result: KUBE_UPDATER_RESULTS } });
const kubeRun = gauge({
  name: 'gateway_kube_updater_last_run_timestamp_seconds',
  help: "When the Kubernetes updater last reconciled (Unix seconds), with its result and the decision's reason.",
  area: AREA,
  labels: { result: KUBE_UPDATER_RESULTS, reason: KUBE_UPDATER_REASONS },
});
const kubeManaged = gauge({
  name: 'gateway_kube_updater_rollout_managed',
  help: "1 when the Kubernetes updater's last reconciliation followed a managed rollout's instruction (canary: 1 when the rollout made this release one of its group's canaries), 0 when it followed its channel.",
  area: AREA,
  labels: { canary: ['true', 'false'] },
});

/** The Kubernetes updater reconciled: result (UPGRADE_RESULTS), the decision's reason (or error), when. */
export function recordKubeUpdaterRun(outcome: string, reason: string, at: Date): void {
  kubeRun.metric.reset();
  kubeRun.set({ result: outcome, reason }, Math.floor(at.getTime() / 1000));
  for (const r of KUBE_UPDATER_RESULTS) kubeResult.set({ result: r }, r === outcome ? 1 : 0);
}

/** Whether the last reconciliation followed a managed rollout (undefined: its channel), and as a canary. */
export function recordKubeUpdaterRollout(rollout: { canary: boolean } | undefined): void {
  kubeManaged.metric.reset();
  kubeManaged.set({ canary: rollout?.canary ? 'true' : 'false' }, rollout ? 1 : 0);
}

const stale = gauge({
  name: 'gateway_agent_upgrade_stale',
  help: "1 when the agent's upgrader has not run for longer than gateway.upgrade_stale_after (or never since that long after start): check gateway-upgrade.timer; 0 when it runs. Absent when the host has no upgrader.",
  area: AREA,
});

/** The agent's measure of its upgrader (src/agent/rollout.ts). */
export function recordUpgradeStale(isStale: boolean): void {
  stale.set({}, isStale ? 1 : 0);
}
