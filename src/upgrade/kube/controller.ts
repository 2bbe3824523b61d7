/**
 * gateway-kube-updater's controller: keeps the agent StatefulSet (or Deployment) on the version its channel
 * serves, inside the maintenance windows the agent exported (docs/kubernetes-updater.md).
 *
 *   triggers      at start; every resyncMs (30 minutes) after the last reconciliation, or earlier when the next
 *                 maintenance window opens before that; on every watch event of the resource (debounced, since a
 *                 rollout sends bursts of status updates), at once when debug.<domain>/trigger-event changed
 *   one run       GET the resource → (unless suspended) ask the Proxy for the managed rollout's instruction
 *                 (instruction.ts, with the host id the agent exported) → when it is managed, decide() on it alone;
 *                 else (404, managed:false, or no instruction source) ask the channel for version + critical and
 *                 read the exported schedule Secret → decide() → PATCH the container image, or log why not
 *                 ("already up to date" with error "no new version (current: v, next: v)")
 *   the watch     from the resourceVersion of the last GET; re-opened when the server ends it (normal every few
 *                 minutes), after WATCH_RETRY when it fails (src/backoff.ts); a 410 Gone starts again from a
 *                 fresh GET
 *
 * Runs never overlap: a trigger during a run makes one more run after it. Nothing here sleeps: timers are
 * injectable, and every failure is logged and retried at the next trigger, never thrown out of the loop.
 */
import type { Logger } from 'pino';
import { Backoff, type BackoffPolicy } from '../../backoff.js';
import { memberOrOutsideServerIdentity } from '../../client/api.js';
import { fetchThroughDialer } from '../../dial/agent.js';
import type { Dialer } from '../../dial/dialer.js';
import { GatewayError, toGatewayError } from '../../errors.js';
import { logger } from '../../log.js';
import { recordKubeUpdaterRollout, recordKubeUpdaterRun } from '../../metrics/upgrade.js';
import { isNoVersion, normalizeVersion, parseCritical } from '../../wire/versions.js';
import { parseKubeSchedule } from '../schedule.js';
import {
  DEFAULT_CONTAINER,
  EVENT_DEBOUNCE_MS,
  RESYNC_INTERVAL_MS,
  decide,
  eventUrgency,
  isSuspended,
  nextReconcileDelay,
  resultOf,
  type AgentWorkload,
  type Decision,
  type InstructionInput,
  type ScheduleInput,
  type TargetInput,
} from './decide.js';
import type { KubeApi, WatchHandle, WorkloadRef } from './client.js';
import { HOST_ID_PATTERN, HOST_ID_SECRET_KEY, type InstructionSource } from './instruction.js';

/** The key of the schedule Secret that holds the JSON the agent exports (src/upgrade/schedule.ts, Kubernetes form). */
export const SCHEDULE_SECRET_KEY = 'agent-maintenance-schedule';

/** The channel's version and critical flag, or `none`: the version server advertises no version (upstream's NoVersion). */
export type ChannelAnswer = { version: string; critical: boolean } | { none: true };

export interface Timers {
  set(fn: () => void, ms: number): { cancel(): void };
}

const realTimers: Timers = {
  set(fn, ms) {
    const t = setTimeout(fn, ms);
    return { cancel: () => clearTimeout(t) };
  },
};

export interface KubeUpdaterOptions {
  api: KubeApi;
  target: WorkloadRef;
  /** The agent container (default "gateway"). */
  container?: string;
  /** The channel's answer (channelVersionSource()). */
  channel: () => Promise<ChannelAnswer>;
  /**
   * The managed rollout's instruction (instructionSource()); asked first at every run. Absent: the channel only, as
   * the seed's updater.
   */
  instruction?: InstructionSource;
  /** The Secret (in the target's namespace) holding the exported schedule, and its key; hostIdKey: the agent's host id. */
  scheduleSecret: { name: string; key?: string; hostIdKey?: string };
  /** Decide and log, but never PATCH. */
  dryRun?: boolean;
  resyncMs?: number;
  debounceMs?: number;
  /** First delay before re-opening a failed watch (WATCH_RETRY's firstMs otherwise); doubles up to 60 s. */
  watchRetryMs?: number;
  clock?: () => Date;
  timers?: Timers;
  log?: Logger;
}

export type ReconcileCause = 'start' | 'resync' | 'event' | 'trigger-event' | 'watch-restart' | 'manual';

/**
 * Re-opening a watch that failed (docs/retries.md, "Retries"): 1 s, doubling to 60 s; an event or a watch the
 * server ended resets it. No jitter: one updater per agent workload, and the API server's own limits apply.
 */
export const WATCH_RETRY: BackoffPolicy = { firstMs: 1_000, maxMs: 60_000, jitter: 'none' };

export class KubeUpdater {
  private readonly api: KubeApi;
  private readonly target: WorkloadRef;
  private readonly container: string;
  private readonly resyncMs: number;
  private readonly debounceMs: number;
  /** Re-opening a failed watch; on this.timers. */
  private readonly watchRetry: Backoff;
  private readonly clock: () => Date;
  private readonly timers: Timers;
  private readonly log: Logger;
  private readonly where: Record<string, string>;

  private stopped = true;
  private running: Promise<Decision | undefined> | undefined;
  private again: ReconcileCause | undefined;
  private timer: { cancel(): void; due: number; cause: ReconcileCause } | undefined;
  private watch: WatchHandle | undefined;
  private resourceVersion: string | undefined;
  private annotations: Readonly<Record<string, string>> | undefined;
  /** Every decision, newest last (the last 50); for tests and `--once`. */
  readonly decisions: Decision[] = [];

  constructor(private readonly options: KubeUpdaterOptions) {
    this.api = options.api;
    this.target = options.target;
    this.container = options.container ?? DEFAULT_CONTAINER;
    this.resyncMs = options.resyncMs ?? RESYNC_INTERVAL_MS;
    this.debounceMs = options.debounceMs ?? EVENT_DEBOUNCE_MS;
    this.clock = options.clock ?? (() => new Date());
    const timers = (this.timers = options.timers ?? realTimers);
    this.watchRetry = new Backoff(
      { ...WATCH_RETRY, firstMs: options.watchRetryMs ?? WATCH_RETRY.firstMs },
      { setTimer: (fn, ms) => timers.set(fn, ms), clearTimer: (h) => (h as { cancel(): void }).cancel() },
    );
    this.log = options.log ?? logger('kube-updater');
    this.where = { kind: this.target.kind, namespace: this.target.namespace, name: this.target.name };
  }

  /** Reconciles once and starts watching. Resolves after the first reconciliation. */
  async start(): Promise<Decision | undefined> {
    this.stopped = false;
    this.log.info({ ...this.where, container: this.container, resync_minutes: this.resyncMs / 60_000 }, 'kube updater started');
    const first = await this.reconcile('start');
    this.openWatch();
    return first;
  }

  stop(): void {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = undefined;
    this.watchRetry.cancel();
    this.watch?.stop();
    this.watch = undefined;
  }

  /** Reconciles now, or once more right after the run in progress. Resolves with that run's decision. */
  reconcile(cause: ReconcileCause = 'manual'): Promise<Decision | undefined> {
    if (this.running) {
      this.again ??= cause;
      return this.running.then(() => this.running ?? (this.stopped ? undefined : this.reconcile(cause)));
    }
    this.timer?.cancel();
    this.timer = undefined;
    const run = this.runOnce(cause).finally(() => {
      this.running = undefined;
      const again = this.again;
      this.again = undefined;
      if (again !== undefined && !this.stopped) void this.reconcile(again);
    });
    this.running = run;
    return run;
  }

  /** Schedules a reconciliation in ms unless one is due sooner. */
  private requestReconcile(ms: number, cause: ReconcileCause): void {
    if (this.stopped) return;
    const due = Date.now() + ms;
    if (this.timer && this.timer.due <= due) return;
    this.timer?.cancel();
    const handle = this.timers.set(() => {
      if (this.timer?.cancel === handle.cancel) this.timer = undefined;
      void this.reconcile(cause);
    }, ms);
    this.timer = { cancel: handle.cancel, due, cause };
  }

  private async runOnce(cause: ReconcileCause): Promise<Decision | undefined> {
    let decision: Decision | undefined;
    let threw = false;
    try {
      decision = await this.decideNow(cause);
      await this.apply(decision);
    } catch (err) {
      threw = true;
      const e = toGatewayError(err);
      this.log.error({ ...this.where, cause, code: e.code, err: e.message }, 'reconciliation failed; retrying at the next resync');
    }
    recordKubeUpdaterRun(resultOf(decision, { dryRun: this.options.dryRun === true, threw }), decision?.reason ?? 'error', this.clock());
    recordKubeUpdaterRollout(decision?.rollout);
    if (decision) {
      this.decisions.push(decision);
      if (this.decisions.length > 50) this.decisions.shift();
    }
    if (!this.stopped) {
      const delay = decision ? nextReconcileDelay(decision, this.clock(), this.resyncMs) : this.resyncMs;
      this.requestReconcile(delay, 'resync');
    }
    return decision;
  }

  private async decideNow(cause: ReconcileCause): Promise<Decision> {
    const { workload, resourceVersion } = await this.api.getWorkload(this.target);
    this.resourceVersion ??= resourceVersion;
    this.annotations ??= workload.annotations;
    this.log.debug({ ...this.where, cause }, 'reconciling');
    if (isSuspended(workload)) {
      return decide({ workload, container: this.container, target: { error: 'not asked' }, schedule: { error: 'not read' }, now: this.clock() });
    }
    const instruction = await this.readInstruction();
    if (instruction && !('unmanaged' in instruction)) {
      // The rollout decides: neither the channel nor the exported windows are read (an unreadable instruction too).
      return decide({ workload, container: this.container, target: { error: 'not asked' }, schedule: { error: 'not read' }, instruction, now: this.clock() });
    }
    if (instruction) this.log.debug({ ...this.where, why: instruction.unmanaged }, 'no managed rollout; following the channel');
    const [target, schedule] = await Promise.all([this.readTarget(), this.readSchedule()]);
    return decide({ workload, container: this.container, target, schedule, now: this.clock() });
  }

  private async readInstruction(): Promise<InstructionInput | undefined> {
    if (!this.options.instruction) return undefined;
    return this.options.instruction(await this.readHostId());
  }

  /** The agent's host id from the shared-state Secret, when it exported a well-formed one. */
  private async readHostId(): Promise<string | undefined> {
    const key = this.options.scheduleSecret.hostIdKey ?? HOST_ID_SECRET_KEY;
    try {
      const text = (await this.api.readSecretKey(this.target.namespace, this.options.scheduleSecret.name, key))?.trim();
      if (text === undefined) return undefined;
      if (HOST_ID_PATTERN.test(text)) return text;
      this.log.warn({ ...this.where, key }, 'the exported host id is not a host id; asking the rollout with the group only');
    } catch (err) {
      this.log.debug({ ...this.where, key, err: toGatewayError(err).message }, 'cannot read the exported host id; asking the rollout with the group only');
    }
    return undefined;
  }

  private async readTarget(): Promise<TargetInput> {
    try {
      return await this.options.channel();
    } catch (err) {
      const e = toGatewayError(err);
      return { error: `${e.code}: ${e.message}` };
    }
  }

  private async readSchedule(): Promise<ScheduleInput> {
    const key = this.options.scheduleSecret.key ?? SCHEDULE_SECRET_KEY;
    const where = `Secret ${this.target.namespace}/${this.options.scheduleSecret.name} key ${key}`;
    try {
      const text = await this.api.readSecretKey(this.target.namespace, this.options.scheduleSecret.name, key);
      if (text === undefined) return { error: `${where} does not exist yet` };
      return { windows: parseKubeSchedule(text) };
    } catch (err) {
      return { error: `${where}: ${toGatewayError(err).message}` };
    }
  }

  private async apply(d: Decision): Promise<void> {
    const fields = { ...this.where, reason: d.reason, ...(d.current ? { current: d.current } : {}), ...(d.next ? { next: d.next } : {}), ...(d.rollout ? { rollout: d.rollout } : {}) };
    if (d.action === 'update') {
      if (this.options.dryRun) {
        this.log.info({ ...fields, image: d.image, dry_run: true }, `would update the agent: ${d.message}`);
        return;
      }
      await this.api.setImage(this.target, d.container, d.image);
      this.log.info({ ...fields, image: d.image }, `updating the agent: ${d.message}`);
      return;
    }
    switch (d.reason) {
      case 'no-new-version':
        // Seed, Errors: "already up to date", with the error field no new version (current: <v>, next: <v>).
        this.log.info({ ...fields, error: d.message }, 'the agent is already up to date');
        return;
      case 'suspended':
      case 'outside-window':
      case 'rollout-waiting':
        this.log.info(fields, d.message);
        return;
      case 'instruction-unreadable':
        this.log.warn({ ...fields, code: 'GW_ERR_AUTOUPDATE_INSTRUCTION' }, d.message);
        return;
      default:
        this.log.warn(fields, d.message);
    }
  }

  // --- the watch ----------------------------------------------------------------------------------------------

  private openWatch(): void {
    if (this.stopped) return;
    let ended = false;
    const onDone = (err?: Error) => {
      if (ended) return;
      ended = true;
      this.watch = undefined;
      if (this.stopped) return;
      if (err) {
        const delay = this.watchRetry.schedule(() => this.restartWatch());
        const e = toGatewayError(err);
        this.log.warn({ ...this.where, code: e.code, err: e.message, retry_ms: delay }, 'watch failed; watching again later');
      } else {
        this.watchRetry.reset();
        this.log.debug(this.where, 'watch ended by the server; watching again');
        this.restartWatch();
      }
    };
    this.api
      .watchWorkload(
        this.target,
        this.resourceVersion,
        (type, workload, rv) => {
          this.watchRetry.reset();
          if (type === 'ERROR') {
            this.resourceVersion = undefined; // 410 Gone or similar: start again from a fresh GET
            return;
          }
          if (rv) this.resourceVersion = rv;
          if (type === 'BOOKMARK' || !workload) return;
          if (type === 'DELETED') {
            this.log.warn(this.where, 'the agent resource was deleted');
            return;
          }
          this.onChange(workload);
        },
        onDone,
      )
      .then(
        (handle) => {
          if (ended || this.stopped) handle.stop();
          else this.watch = handle;
        },
        (err: unknown) => onDone(err instanceof Error ? err : new GatewayError('GW_ERR_KUBE_API', String(err))),
      );
  }

  private restartWatch(): void {
    if (this.stopped) return;
    if (this.resourceVersion === undefined) {
      // A fresh GET (in the reconciliation) gives the resourceVersion to watch from.
      void this.reconcile('watch-restart').finally(() => this.openWatch());
      return;
    }
    this.openWatch();
  }

  private onChange(workload: AgentWorkload): void {
    const urgency = eventUrgency(this.annotations, workload.annotations);
    this.annotations = workload.annotations;
    if (urgency === 'now') {
      this.log.info(this.where, 'trigger-event annotation changed; reconciling now');
      void this.reconcile('trigger-event');
    } else {
      this.requestReconcile(this.debounceMs, 'event');
    }
  }
}

/** "https://<proxy>/v1/webapi/automaticupgrades/channel/<channel>" (channel segments percent-encoded). */
export function channelUrl(proxyAddr: string, channel: string): string {
  const host = proxyAddr.replace(/^https?:\/\//, '').replace(/\/+$/, '');
  return `https://${host}/v1/webapi/automaticupgrades/channel/${channel.split('/').map(encodeURIComponent).join('/')}`;
}

const proxyOrOutside = memberOrOutsideServerIdentity('proxy');

/**
 * Asks the version server for <base>/version and <base>/critical through the Dialer (HTTPS_PROXY / NO_PROXY
 * apply). A failed /critical counts as "no": only the version is needed to decide.
 */
export function channelVersionSource(options: {
  baseUrl: string;
  dialer: Dialer;
  ca?: string;
  rejectUnauthorized?: boolean;
  timeoutMs?: number;
  log?: Logger;
}): () => Promise<ChannelAnswer> {
  const base = options.baseUrl.replace(/\/+$/, '');
  const log = options.log ?? logger('kube-updater');
  const get = async (what: 'version' | 'critical'): Promise<string> => {
    const r = await fetchThroughDialer(`${base}/${what}`, {
      dialer: options.dialer,
      timeoutMs: options.timeoutMs ?? 10_000,
      maxBodyBytes: 4096,
      headers: { accept: 'text/plain' },
      ...(options.ca === undefined ? {} : { ca: options.ca }),
      ...(options.rejectUnauthorized === undefined ? {} : { rejectUnauthorized: options.rejectUnauthorized }),
      tlsPeer: { server: 'proxy', untrustedHint: "Give the CA that signs the Proxy's certificate with --ca-file (the chart: updater.proxyCASecret)." },
      // A certificate of the cluster's CA must be a Proxy's; a public or the operator's own CA's, chain and name.
      checkServerIdentity: proxyOrOutside,
    });
    if (r.status !== 200) throw new GatewayError('GW_ERR_UPGRADE_VERSION_SERVER', `${base}/${what} answered HTTP ${r.status}`);
    return r.body.toString('utf8').trim();
  };
  return async () => {
    const text = await get('version');
    const version = normalizeVersion(text);
    // Upstream's updater takes "none" as "no new version": logged, nothing changed, no error (NoNewVersionError).
    if (version === undefined && isNoVersion(text)) return { none: true };
    if (version === undefined) throw new GatewayError('GW_ERR_UPGRADE_VERSION_SERVER', `${base}/version answered ${JSON.stringify(text.slice(0, 40))}, not a version`);
    let critical = false;
    try {
      critical = parseCritical(await get('critical')) === 'yes';
    } catch (err) {
      log.debug({ err: toGatewayError(err).message }, 'cannot read the critical flag; treating the version as not critical');
    }
    return { version, critical };
  };
}
