/**
 * The Kubernetes updater's decisions, as pure functions.
 * Nothing here talks to Kubernetes or the network: controller.ts gathers the inputs and applies the result, and
 * test/upgrade/kube.test.ts checks every rule here directly (the managed ones: test/upgrade/kube-rollout.test.ts).
 *
 *   decide()        one reconciliation of the agent StatefulSet / Deployment:
 *                     1. annotated <domain>/skipreconcile: "true"         → skip (suspended)
 *                     2. no agent container / its tag is not a version    → skip
 *                    managed rollout (the Proxy's instruction, issue 28; absent, 404 or managed:false: the seed's 3-8):
 *                     m1. the instruction is unreadable                   → skip, with its code; the channel is NOT asked
 *                     m2. its version is the current one                  → skip "no new version"
 *                     m3. update: false                                   → skip "waiting: <the rollout's reason>"
 *                     m4. more than one major from the running version    → skip (refused: one major at a time)
 *                     m5. update: true                                    → update to its version, a lower one too
 *                                                                           (a rollback); no window, no schedule: the
 *                                                                           rollout already placed the group's windows
 *                     3. the channel's version unknown (server down)      → skip, retried at the next resync
 *                     4. target <= current                                → skip "no new version (current: v, next: v)"
 *                     5. the channel marks the version critical           → update now, window or not
 *                     6. no valid exported schedule                       → skip (warned: expected right after install)
 *                     7. outside every maintenance window                 → skip until the next window opens
 *                     8. otherwise                                        → update: same image repository, new tag
 *   eventUrgency()  an event on the resource: a change of debug.<domain>/trigger-event reconciles at once, any
 *                   other change after a short debounce (a rollout sends a burst of status updates).
 *   nextReconcileDelay()  when to look again without an event: the 30-minute resync, or earlier when the next
 *                   maintenance window opens before that; 5 minutes under a managed rollout.
 */
import semver from 'semver';
import type { AgentInstruction } from '../../wire/autoupdate.js';
import { normalizeVersion } from '../../wire/versions.js';
import { isoSeconds, nextWindowAfter, windowAt, type Window } from '../windows.js';

/**
 * The domain of the gateway's own annotations. Documented in docs/kubernetes-updater.md (written
 * <gateway_domain> there).
 */
export const GATEWAY_DOMAIN = 'gateway.dev';
/** Set to "true" on the agent StatefulSet / Deployment: the updater leaves it alone. */
export const SKIP_RECONCILE_ANNOTATION = `${GATEWAY_DOMAIN}/skipreconcile`;
/** Change its value (e.g. to "1") on the agent resource: the updater reconciles at once. */
export const TRIGGER_EVENT_ANNOTATION = `debug.${GATEWAY_DOMAIN}/trigger-event`;
/** Seed, Limits: reconciliation every 30 minutes, or on a Kubernetes event. */
export const RESYNC_INTERVAL_MS = 30 * 60 * 1000;
/**
 * Under a managed rollout the instruction is asked again after 5 minutes: a group's start, the canaries' turn and a
 * rollback (`gwctl autoupdate rollback --now` above all) reach the release that soon, not after the seed's 30.
 */
export const MANAGED_RESYNC_MS = 5 * 60 * 1000;
/** Events other than the trigger annotation are merged over this long. */
export const EVENT_DEBOUNCE_MS = 2_000;
/** The agent's container in the chart's pod template. */
export const DEFAULT_CONTAINER = 'gateway';

export type WorkloadKind = 'StatefulSet' | 'Deployment';

/** What the updater needs to know of the agent resource. */
export interface AgentWorkload {
  kind: WorkloadKind;
  namespace: string;
  name: string;
  annotations: Readonly<Record<string, string>>;
  /** The pod template's containers. */
  containers: ReadonlyArray<{ name: string; image: string }>;
}

/** The channel's answer, or why there is none. */
export type TargetInput = { version: string; critical: boolean } | { none: true } | { error: string };
/**
 * The Proxy's rollout instruction (controller.ts asks it before the channel): unmanaged (404 from an earlier Proxy,
 * or managed:false) keeps the seed's behaviour; an instruction decides; an error (unreachable, slow, oversized,
 * malformed) decides that nothing changes.
 */
export type InstructionInput = { unmanaged: string } | { instruction: AgentInstruction } | { error: string; code: string };
/** The exported maintenance windows, or why there are none. */
export type ScheduleInput = { windows: readonly Window[] } | { error: string };

export interface DecisionInput {
  workload: AgentWorkload;
  /** The agent container's name (DEFAULT_CONTAINER in the chart). */
  container: string;
  target: TargetInput;
  schedule: ScheduleInput;
  /** Absent: no rollout is asked (the seed's behaviour). */
  instruction?: InstructionInput;
  now: Date;
}

export type SkipReason =
  | 'suspended'
  | 'no-container'
  | 'unknown-current'
  | 'no-target'
  | 'no-new-version'
  | 'no-schedule'
  | 'outside-window'
  | 'rollout-waiting'
  | 'instruction-unreadable'
  | 'unsafe-version';
/** in-window, critical: the channel's; rollout, rollback: the managed rollout's instruction (up, or down). */
export type UpdateReason = 'in-window' | 'critical' | 'rollout' | 'rollback';

/** What the rollout said of this release (for logs and metrics), when it is managed. */
export interface RolloutNote {
  group?: string;
  canary: boolean;
  rollout_id?: string;
}

export type Decision =
  | { action: 'update'; reason: UpdateReason; message: string; current: string; next: string; container: string; image: string; rollout?: RolloutNote }
  | {
      action: 'skip';
      reason: SkipReason;
      rollout?: RolloutNote;
      message: string;
      current?: string;
      next?: string;
      /** When the decision may change without an event (the next window's start). */
      retryAt?: Date;
    };

/**
 * A reconciliation's result in the upgraders' closed set (src/metrics/upgrade.ts UPGRADE_RESULTS), for its metric:
 * an applied update is upgraded; a run that threw (or an update the API refused) failed; no new version is
 * up-to-date (the version server's `none` included); a suspended resource, a closed window and a dry run's update
 * are waiting; what needs an operator's fix (no container, no readable version, no channel answer, no schedule)
 * failed.
 */
export function resultOf(d: Decision | undefined, o: { dryRun: boolean; threw: boolean }): 'upgraded' | 'rolled-back' | 'up-to-date' | 'waiting' | 'failed' {
  if (!d || o.threw) return 'failed';
  if (d.action === 'update') return o.dryRun ? 'waiting' : d.reason === 'rollback' ? 'rolled-back' : 'upgraded';
  if (d.reason === 'no-new-version') return 'up-to-date';
  if (d.reason === 'suspended' || d.reason === 'outside-window' || d.reason === 'rollout-waiting') return 'waiting';
  return 'failed';
}

// --- images -------------------------------------------------------------------------------------------------------

export interface ImageRef {
  /** Everything before the tag: registry, port, path, name (registry.example.com:5000/gateway/agent). */
  repository: string;
  tag: string | undefined;
  digest: string | undefined;
}

/** Splits an image reference; the tag is after the last ":" that follows the last "/" (a registry port is not a tag). */
export function parseImage(image: string): ImageRef {
  let rest = image.trim();
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
  }
  const slash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > slash) return { repository: rest.slice(0, colon), tag: rest.slice(colon + 1), digest };
  return { repository: rest, tag: undefined, digest };
}

/** The version an image's tag names ("17.0.1" or "v17.0.1" → "v17.0.1"), or undefined. */
export function imageVersion(image: string): string | undefined {
  const { tag } = parseImage(image);
  return tag === undefined ? undefined : normalizeVersion(tag);
}

/**
 * The same repository with the tag of `version`, written the way the current tag is (with or without the leading
 * "v"). A digest is dropped: it would pin the old image.
 */
export function imageFor(currentImage: string, version: string): string {
  const { repository, tag } = parseImage(currentImage);
  const bare = version.replace(/^v/, '');
  return `${repository}:${tag?.startsWith('v') ? `v${bare}` : bare}`;
}

// --- the decision -----------------------------------------------------------------------------------------------

/** The message when there is nothing to do (docs/kubernetes-updater.md). */
export function noNewVersionMessage(current: string, next: string): string {
  return `no new version (current: ${current}, next: ${next})`;
}

function bare(v: string): string {
  return v.replace(/^v/, '');
}

/** Whether the resource is annotated <domain>/skipreconcile: "true" (case and surrounding spaces ignored). */
export function isSuspended(workload: Pick<AgentWorkload, 'annotations'>): boolean {
  return workload.annotations[SKIP_RECONCILE_ANNOTATION]?.trim().toLowerCase() === 'true';
}

export function decide(input: DecisionInput): Decision {
  const { workload, container, target, schedule, now } = input;
  if (isSuspended(workload)) {
    return { action: 'skip', reason: 'suspended', message: `reconciliation suspended: ${SKIP_RECONCILE_ANNOTATION} is "true"` };
  }
  const agent = workload.containers.find((c) => c.name === container);
  if (!agent) {
    const names = workload.containers.map((c) => c.name).join(', ') || 'none';
    return { action: 'skip', reason: 'no-container', message: `the pod template has no container "${container}" (it has: ${names})` };
  }
  const current = imageVersion(agent.image);
  if (current === undefined) {
    return { action: 'skip', reason: 'unknown-current', message: `the image ${agent.image} has no version tag, so the current version is unknown` };
  }
  if (input.instruction && !('unmanaged' in input.instruction)) return decideManaged(input.instruction, current, agent.image, container);
  if ('error' in target) {
    return { action: 'skip', reason: 'no-target', message: `the channel's version is unknown: ${target.error}`, current };
  }
  if ('none' in target) {
    return { action: 'skip', reason: 'no-new-version', message: `no new version: the version server advertises none ("none"), current: ${current}`, current };
  }
  const next = normalizeVersion(target.version);
  if (next === undefined) {
    return { action: 'skip', reason: 'no-target', message: `the channel answered ${JSON.stringify(target.version)}, which is not a version`, current };
  }
  if (semver.lte(bare(next), bare(current))) {
    return { action: 'skip', reason: 'no-new-version', message: noNewVersionMessage(current, next), current, next };
  }
  const update = (reason: 'in-window' | 'critical', message: string): Decision => ({
    action: 'update',
    reason,
    message,
    current,
    next,
    container,
    image: imageFor(agent.image, next),
  });
  if (target.critical) return update('critical', `critical update ${current} -> ${next}: applied without waiting for a maintenance window`);
  if ('error' in schedule) {
    return { action: 'skip', reason: 'no-schedule', message: `invalid upgrade schedule: ${schedule.error} (expected until the agent has exported its maintenance schedule)`, current, next };
  }
  const open = windowAt(now, schedule.windows);
  if (!open) {
    const upcoming = nextWindowAfter(now, schedule.windows);
    return {
      action: 'skip',
      reason: 'outside-window',
      message: `update ${current} -> ${next} waits for the maintenance window${upcoming ? ` opening at ${isoSeconds(upcoming.start)}` : ' (none is scheduled)'}`,
      current,
      next,
      ...(upcoming ? { retryAt: upcoming.start } : {}),
    };
  }
  return update('in-window', `update ${current} -> ${next} in the maintenance window ${isoSeconds(open.start)}..${isoSeconds(open.stop)}`);
}

/**
 * A managed rollout's decision: the instruction alone (never the channel, nor the exported windows). A version lower
 * than the running one is installed too: that is a rollback the rollout decided (the channel path never goes down).
 */
export function decideManaged(instruction: Exclude<InstructionInput, { unmanaged: string }>, current: string, image: string, container: string): Decision {
  if ('error' in instruction) {
    return {
      action: 'skip',
      reason: 'instruction-unreadable',
      message: `the rollout instruction is unreadable (${instruction.code}): ${instruction.error}; nothing changes, and the channel is not asked instead`,
      current,
    };
  }
  const i = instruction.instruction;
  const rollout: RolloutNote = { canary: i.canary === true, ...(i.group !== undefined ? { group: i.group } : {}), ...(i.rollout_id ? { rollout_id: i.rollout_id } : {}) };
  const next = i.version === undefined ? undefined : normalizeVersion(i.version);
  if (next !== undefined && semver.eq(bare(next), bare(current))) {
    return { action: 'skip', reason: 'no-new-version', message: `${noNewVersionMessage(current, next)}: ${i.reason}`, current, next, rollout };
  }
  if (!i.update || next === undefined) {
    return { action: 'skip', reason: 'rollout-waiting', message: `waiting: ${i.reason}`, current, ...(next ? { next } : {}), rollout };
  }
  if (Math.abs(semver.major(bare(next)) - semver.major(bare(current))) > 1) {
    // The rollout's planner keeps this rule too (issue 28, safety rules); a release does not trust it blindly: two
    // majors at once is never a step the agent's state and configuration were made for, up or down.
    return {
      action: 'skip',
      reason: 'unsafe-version',
      message: `the rollout names ${next}, more than one major version from ${current}: refused, an agent moves one major version at a time (${i.reason})`,
      current,
      next,
      rollout,
    };
  }
  const down = semver.lt(bare(next), bare(current));
  const who = `${rollout.canary ? 'canary of ' : ''}group ${rollout.group || '(none)'}${rollout.rollout_id ? `, rollout ${rollout.rollout_id}` : ''}`;
  return {
    action: 'update',
    reason: down ? 'rollback' : 'rollout',
    message: `${down ? 'rollback' : 'rollout'} ${current} -> ${next} (${who}): ${i.reason}`,
    current,
    next,
    container,
    image: imageFor(image, next),
    rollout,
  };
}

/**
 * How long until the next reconciliation without an event: the resync interval, or the next window if sooner; under
 * a managed rollout MANAGED_RESYNC_MS when that is sooner.
 */
export function nextReconcileDelay(decision: Decision, now: Date, resyncMs: number = RESYNC_INTERVAL_MS): number {
  if (managedDecision(decision)) return Math.min(resyncMs, MANAGED_RESYNC_MS);
  if (decision.action === 'skip' && decision.retryAt) {
    const until = decision.retryAt.getTime() - now.getTime();
    if (until >= 0 && until < resyncMs) return until;
  }
  return resyncMs;
}

/** Whether the decision came from the rollout's instruction (its reasons, or a note of the rollout). */
export function managedDecision(d: Decision): boolean {
  return d.rollout !== undefined || d.reason === 'instruction-unreadable';
}

// --- events -----------------------------------------------------------------------------------------------------

/**
 * How soon an event on the agent resource is reconciled: 'now' when the trigger annotation's value changed
 * (added, changed or removed), 'debounced' for any other change.
 */
export function eventUrgency(previous: Readonly<Record<string, string>> | undefined, next: Readonly<Record<string, string>>): 'now' | 'debounced' {
  return (previous?.[TRIGGER_EVENT_ANNOTATION] ?? undefined) !== (next[TRIGGER_EVENT_ANNOTATION] ?? undefined) ? 'now' : 'debounced';
}
