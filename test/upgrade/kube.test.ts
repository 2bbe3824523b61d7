/**
 * The Kubernetes updater's decisions (pure functions) and its controller loop, driven through a KubeApi stand-in
 * and hand-fired timers. No Kubernetes API server can run on this machine: the real client calls are checked in
 * kube-client.test.ts against a recorded API exchange.
 */
import fc from 'fast-check';
import semver from 'semver';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Writable } from 'node:stream';
import { createLogger } from '../../src/log.js';
import type { KubeApi, WatchEventType, WorkloadRef } from '../../src/upgrade/kube/client.js';
import { KubeUpdater, WATCH_RETRY, channelUrl, type Timers } from '../../src/upgrade/kube/controller.js';
import {
  RESYNC_INTERVAL_MS,
  SKIP_RECONCILE_ANNOTATION,
  TRIGGER_EVENT_ANNOTATION,
  decide,
  eventUrgency,
  imageFor,
  imageVersion,
  nextReconcileDelay,
  parseImage,
  resultOf,
  type AgentWorkload,
  type Decision,
  type DecisionInput,
  type SkipReason,
} from '../../src/upgrade/kube/decide.js';
import { enableMetrics } from '../../src/metrics/define.js';
import { registry } from '../../src/metrics/registry.js';
import { parseExposition, sampleValue } from '../helpers/metrics.js';
import { formatKubeSchedule } from '../../src/upgrade/schedule.js';
import type { Window } from '../../src/upgrade/windows.js';

const at = (iso: string) => new Date(iso);
const WINDOWS: Window[] = [
  { start: at('2026-01-05T02:00:00Z'), stop: at('2026-01-05T03:00:00Z') },
  { start: at('2026-01-06T02:00:00Z'), stop: at('2026-01-06T03:00:00Z') },
];
const IN_WINDOW = at('2026-01-05T02:30:00Z');
const OUTSIDE = at('2026-01-05T12:00:00Z');

function workload(image = 'registry.example.com/gateway/gateway:17.0.1', annotations: Record<string, string> = {}): AgentWorkload {
  return { kind: 'StatefulSet', namespace: 'gw', name: 'gateway-agent', annotations, containers: [{ name: 'gateway', image }, { name: 'sidecar', image: 'busybox:1.36' }] };
}

function input(over: Partial<DecisionInput> = {}): DecisionInput {
  return { workload: workload(), container: 'gateway', target: { version: 'v17.0.2', critical: false }, schedule: { windows: WINDOWS }, now: IN_WINDOW, ...over };
}

describe('images', () => {
  it('parses repository, tag and digest; a registry port is not a tag', () => {
    expect(parseImage('gateway:17.0.1')).toEqual({ repository: 'gateway', tag: '17.0.1', digest: undefined });
    expect(parseImage('registry:5000/gw/gateway:v17.0.1')).toEqual({ repository: 'registry:5000/gw/gateway', tag: 'v17.0.1', digest: undefined });
    expect(parseImage('registry:5000/gw/gateway')).toEqual({ repository: 'registry:5000/gw/gateway', tag: undefined, digest: undefined });
    expect(parseImage('gw/gateway:17.0.1@sha256:abcd')).toEqual({ repository: 'gw/gateway', tag: '17.0.1', digest: 'sha256:abcd' });
  });

  it('reads the version from the tag, with or without v', () => {
    expect(imageVersion('gateway:17.0.1')).toBe('v17.0.1');
    expect(imageVersion('gateway:v17.0.0-dev')).toBe('v17.0.0-dev');
    expect(imageVersion('gateway:latest')).toBeUndefined();
    expect(imageVersion('gateway')).toBeUndefined();
  });

  it('writes the new tag in the style of the old one, and drops a digest', () => {
    expect(imageFor('registry:5000/gw/gateway:17.0.1', 'v17.0.2')).toBe('registry:5000/gw/gateway:17.0.2');
    expect(imageFor('gw/gateway:v17.0.1', 'v17.0.2')).toBe('gw/gateway:v17.0.2');
    expect(imageFor('gw/gateway:17.0.1@sha256:abcd', 'v18.0.0')).toBe('gw/gateway:18.0.0');
  });
});

describe('decide', () => {
  it('updates inside a maintenance window: same repository, new tag', () => {
    expect(decide(input())).toMatchObject({ action: 'update', reason: 'in-window', current: 'v17.0.1', next: 'v17.0.2', container: 'gateway', image: 'registry.example.com/gateway/gateway:17.0.2' });
  });

  it('windows are [start, stop)', () => {
    expect(decide(input({ now: at('2026-01-05T02:00:00Z') })).action).toBe('update');
    expect(decide(input({ now: at('2026-01-05T02:59:59.999Z') })).action).toBe('update');
    expect(decide(input({ now: at('2026-01-05T03:00:00Z') }))).toMatchObject({ action: 'skip', reason: 'outside-window' });
  });

  it('nothing to do: the seed\'s message, for an equal and for an older channel version', () => {
    expect(decide(input({ target: { version: 'v17.0.1', critical: false } }))).toEqual({
      action: 'skip',
      reason: 'no-new-version',
      message: 'no new version (current: v17.0.1, next: v17.0.1)',
      current: 'v17.0.1',
      next: 'v17.0.1',
    });
    expect(decide(input({ target: { version: '16.4.0', critical: true } })).message).toBe('no new version (current: v17.0.1, next: v16.4.0)');
  });

  it('skips a resource annotated skipreconcile: "true", whatever else holds', () => {
    const d = decide(input({ workload: workload(undefined, { [SKIP_RECONCILE_ANNOTATION]: 'true' }), target: { version: 'v99.0.0', critical: true } }));
    expect(d).toMatchObject({ action: 'skip', reason: 'suspended' });
    expect(d.message).toContain('gateway.dev/skipreconcile');
    // Anything but "true" does not suspend.
    expect(decide(input({ workload: workload(undefined, { [SKIP_RECONCILE_ANNOTATION]: 'false' }) })).action).toBe('update');
  });

  it('outside the window it waits, and says when the next window opens', () => {
    const d = decide(input({ now: OUTSIDE }));
    expect(d).toMatchObject({ action: 'skip', reason: 'outside-window', retryAt: WINDOWS[1]!.start });
    expect(d.message).toContain('2026-01-06T02:00:00Z');
  });

  it('a critical version does not wait for a window, nor for a schedule', () => {
    expect(decide(input({ now: OUTSIDE, target: { version: 'v17.0.2', critical: true } }))).toMatchObject({ action: 'update', reason: 'critical' });
    expect(decide(input({ schedule: { error: 'none yet' }, target: { version: 'v17.0.2', critical: true } }))).toMatchObject({ action: 'update', reason: 'critical' });
  });

  it('without a valid exported schedule: skip with the invalid-schedule warning', () => {
    const d = decide(input({ schedule: { error: 'Secret gw/gateway-agent-shared-state does not exist yet' } }));
    expect(d).toMatchObject({ action: 'skip', reason: 'no-schedule' });
    expect(d.message).toMatch(/invalid upgrade schedule/);
  });

  it('skips when the container, its version or the channel version is missing', () => {
    expect(decide(input({ container: 'agent' }))).toMatchObject({ action: 'skip', reason: 'no-container' });
    expect(decide(input({ workload: workload('gw/gateway:latest') }))).toMatchObject({ action: 'skip', reason: 'unknown-current' });
    expect(decide(input({ target: { error: 'connection refused' } }))).toMatchObject({ action: 'skip', reason: 'no-target', current: 'v17.0.1' });
    expect(decide(input({ target: { version: 'banana', critical: false } }))).toMatchObject({ action: 'skip', reason: 'no-target' });
  });

  it('property: it updates exactly when the channel version is newer (inside a window)', () => {
    const version = fc.tuple(fc.nat(30), fc.nat(30), fc.nat(30)).map(([a, b, c]) => `${a}.${b}.${c}`);
    fc.assert(
      fc.property(version, version, (current, target) => {
        const d = decide(input({ workload: workload(`gw/gateway:${current}`), target: { version: target, critical: false } }));
        expect(d.action === 'update').toBe(semver.gt(target, current));
        if (d.action === 'update') expect(d.image).toBe(`gw/gateway:${target}`);
      }),
    );
  });
});

describe('when to look again', () => {
  it('30 minutes, or sooner when the next window opens before that', () => {
    expect(RESYNC_INTERVAL_MS).toBe(30 * 60 * 1000);
    expect(nextReconcileDelay(decide(input()), IN_WINDOW)).toBe(RESYNC_INTERVAL_MS);
    const tenBefore = at('2026-01-06T01:50:00Z');
    expect(nextReconcileDelay(decide(input({ now: tenBefore })), tenBefore)).toBe(10 * 60 * 1000);
    expect(nextReconcileDelay(decide(input({ now: OUTSIDE })), OUTSIDE)).toBe(RESYNC_INTERVAL_MS);
  });

  it('the trigger annotation reconciles now; any other change is debounced', () => {
    expect(eventUrgency({}, { [TRIGGER_EVENT_ANNOTATION]: '1' })).toBe('now');
    expect(eventUrgency({ [TRIGGER_EVENT_ANNOTATION]: '1' }, { [TRIGGER_EVENT_ANNOTATION]: '2' })).toBe('now');
    expect(eventUrgency({ [TRIGGER_EVENT_ANNOTATION]: '1' }, {})).toBe('now');
    expect(eventUrgency({ [TRIGGER_EVENT_ANNOTATION]: '1' }, { [TRIGGER_EVENT_ANNOTATION]: '1', other: 'x' })).toBe('debounced');
    expect(eventUrgency(undefined, {})).toBe('debounced');
  });

  it('the channel URL is the seed\'s path, channel segments encoded', () => {
    expect(channelUrl('proxy.example.com:443', 'default')).toBe('https://proxy.example.com:443/v1/webapi/automaticupgrades/channel/default');
    expect(channelUrl('https://proxy.example.com/', 'stable/v17')).toBe('https://proxy.example.com/v1/webapi/automaticupgrades/channel/stable/v17');
  });
});

// --- the controller, with a KubeApi stand-in -----------------------------------------------------------------------

class FakeTimers implements Timers {
  pending: Array<{ fn: () => void; ms: number; cancelled: boolean }> = [];
  set(fn: () => void, ms: number) {
    const t = { fn, ms, cancelled: false };
    this.pending.push(t);
    return { cancel: () => void (t.cancelled = true) };
  }
  live() {
    return this.pending.filter((t) => !t.cancelled);
  }
  /** Fires the live timers of exactly ms (each once). */
  fire(ms: number) {
    const due = this.live().filter((t) => t.ms === ms);
    for (const t of due) {
      t.cancelled = true;
      t.fn();
    }
    return due.length;
  }
}

class FakeKube implements KubeApi {
  current: AgentWorkload = workload();
  schedule: string | undefined = JSON.stringify(formatKubeSchedule(WINDOWS, at('2026-01-05T01:00:00Z')));
  calls: string[] = [];
  watches: Array<{
    rv: string | undefined;
    onEvent: (type: WatchEventType, w: AgentWorkload | undefined, rv: string | undefined) => void;
    onDone: (err?: Error) => void;
    stopped: boolean;
  }> = [];
  rv = 100;

  async getWorkload(ref: WorkloadRef) {
    this.calls.push(`get ${ref.kind} ${ref.namespace}/${ref.name}`);
    return { workload: this.current, resourceVersion: String(this.rv) };
  }
  async setImage(ref: WorkloadRef, container: string, image: string) {
    this.calls.push(`patch ${ref.name} ${container}=${image}`);
    this.current = { ...this.current, containers: this.current.containers.map((c) => (c.name === container ? { ...c, image } : c)) };
    this.rv++;
  }
  async readSecretKey(namespace: string, name: string, key: string) {
    this.calls.push(`secret ${namespace}/${name}#${key}`);
    return this.schedule;
  }
  async writeSecretKey(namespace: string, name: string, key: string, value: string) {
    this.calls.push(`write ${namespace}/${name}#${key}`);
    this.schedule = value;
  }
  async watchWorkload(
    _ref: WorkloadRef,
    rv: string | undefined,
    onEvent: (type: WatchEventType, w: AgentWorkload | undefined, rv: string | undefined) => void,
    onDone: (err?: Error) => void,
  ) {
    this.calls.push(`watch from ${rv ?? 'now'}`);
    const w = { rv, onEvent, onDone, stopped: false };
    this.watches.push(w);
    return { stop: () => void (w.stopped = true) };
  }
  event(type: WatchEventType, annotations: Record<string, string> = {}) {
    this.current = { ...this.current, annotations };
    this.rv++;
    this.watches.at(-1)!.onEvent(type, this.current, String(this.rv));
  }
}

function collectLogs() {
  const lines: Array<Record<string, unknown>> = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { lines, log: createLogger({ level: 'debug', format: 'json', destination: sink }) };
}

const settle = () => new Promise((r) => setImmediate(r));

function updater(kube: FakeKube, over: { now?: Date; channel?: () => Promise<{ version: string; critical: boolean }> } = {}) {
  const timers = new FakeTimers();
  const logs = collectLogs();
  let channelCalls = 0;
  const u = new KubeUpdater({
    api: kube,
    target: { kind: 'StatefulSet', namespace: 'gw', name: 'gateway-agent' },
    channel:
      over.channel ??
      (async () => {
        channelCalls++;
        return { version: 'v17.0.2', critical: false };
      }),
    scheduleSecret: { name: 'gateway-agent-shared-state' },
    clock: () => over.now ?? IN_WINDOW,
    timers,
    debounceMs: 2000,
    log: logs.log,
  });
  return { u, timers, logs, channelCalls: () => channelCalls };
}

describe('KubeUpdater', () => {
  it('at start: GET, channel, schedule Secret, PATCH of the image; then watches and resyncs in 30 minutes', async () => {
    const kube = new FakeKube();
    const { u, timers, logs } = updater(kube);
    const d = await u.start();
    expect(d).toMatchObject({ action: 'update', image: 'registry.example.com/gateway/gateway:17.0.2' });
    expect(kube.calls).toEqual([
      'get StatefulSet gw/gateway-agent',
      'secret gw/gateway-agent-shared-state#agent-maintenance-schedule',
      'patch gateway-agent gateway=registry.example.com/gateway/gateway:17.0.2',
      'watch from 100',
    ]);
    expect(timers.live().map((t) => t.ms)).toEqual([RESYNC_INTERVAL_MS]);
    expect(logs.lines.some((l) => typeof l.msg === 'string' && l.msg.startsWith('updating the agent'))).toBe(true);
    u.stop();
  });

  it('the 30-minute resync finds nothing to do and logs the seed\'s line', async () => {
    const kube = new FakeKube();
    const { u, timers, logs } = updater(kube);
    await u.start();
    expect(timers.fire(RESYNC_INTERVAL_MS)).toBe(1);
    await settle();
    await settle();
    const line = logs.lines.find((l) => l.msg === 'the agent is already up to date');
    expect(line).toMatchObject({ error: 'no new version (current: v17.0.2, next: v17.0.2)', kind: 'StatefulSet', namespace: 'gw', name: 'gateway-agent' });
    expect(kube.calls.filter((c) => c.startsWith('patch'))).toHaveLength(1);
    expect(timers.live().map((t) => t.ms)).toEqual([RESYNC_INTERVAL_MS]);
    u.stop();
    expect(timers.live()).toHaveLength(0);
  });

  it('skipreconcile: no channel request, no Secret read, no PATCH', async () => {
    const kube = new FakeKube();
    kube.current = workload(undefined, { [SKIP_RECONCILE_ANNOTATION]: 'true' });
    const { u, channelCalls } = updater(kube);
    expect(await u.start()).toMatchObject({ action: 'skip', reason: 'suspended' });
    expect(channelCalls()).toBe(0);
    expect(kube.calls).toEqual(['get StatefulSet gw/gateway-agent', 'watch from 100']);
    u.stop();
  });

  it('an event is debounced; a change of the trigger annotation reconciles at once', async () => {
    const kube = new FakeKube();
    const { u, timers } = updater(kube, { now: OUTSIDE });
    await u.start();
    const before = u.decisions.length;
    kube.event('MODIFIED', { unrelated: 'x' });
    // One timer: the debounced run replaces the resync (it schedules the next resync itself).
    expect(timers.live().map((t) => t.ms)).toEqual([2000]);
    expect(u.decisions.length).toBe(before);
    kube.event('MODIFIED', { unrelated: 'x', [TRIGGER_EVENT_ANNOTATION]: '1' });
    await settle();
    await settle();
    expect(u.decisions.length).toBe(before + 1);
    expect(u.decisions.at(-1)).toMatchObject({ reason: 'outside-window' });
    u.stop();
  });

  it('outside the window, the next run is when the window opens (if sooner than 30 minutes)', async () => {
    const kube = new FakeKube();
    const { u, timers } = updater(kube, { now: at('2026-01-06T01:45:00Z') });
    await u.start();
    expect(timers.live().map((t) => t.ms)).toEqual([15 * 60 * 1000]);
    u.stop();
  });

  it('a version server that is down: skip, logged, retried at the resync', async () => {
    const kube = new FakeKube();
    const { u, timers, logs } = updater(kube, {
      channel: async () => {
        throw new Error('connect ECONNREFUSED');
      },
    });
    expect(await u.start()).toMatchObject({ action: 'skip', reason: 'no-target' });
    expect(logs.lines.some((l) => l.level === 40 && String(l.msg).includes('ECONNREFUSED'))).toBe(true);
    expect(timers.live().map((t) => t.ms)).toEqual([RESYNC_INTERVAL_MS]);
    u.stop();
  });

  it('no exported schedule yet: the invalid-schedule warning, no PATCH', async () => {
    const kube = new FakeKube();
    kube.schedule = undefined;
    const { u, logs } = updater(kube);
    expect(await u.start()).toMatchObject({ action: 'skip', reason: 'no-schedule' });
    expect(logs.lines.some((l) => l.level === 40 && String(l.msg).includes('invalid upgrade schedule'))).toBe(true);
    expect(kube.calls.some((c) => c.startsWith('patch'))).toBe(false);
    u.stop();
  });

  it('the watch: re-opened at once when the server ends it, after a delay when it fails, from a fresh GET after 410', async () => {
    const kube = new FakeKube();
    const { u, timers } = updater(kube, { now: OUTSIDE });
    await u.start();
    kube.watches[0]!.onDone(); // normal server-side end
    expect(kube.watches).toHaveLength(2);
    kube.event('ERROR'); // 410 Gone: the resourceVersion is forgotten
    kube.watches[1]!.onDone(new Error('HTTP 410'));
    expect(kube.watches).toHaveLength(2);
    const retry = timers.live().find((t) => t.ms === 1000);
    expect(retry).toBeDefined();
    const gets = kube.calls.filter((c) => c.startsWith('get')).length;
    timers.fire(1000);
    await settle();
    await settle();
    await settle();
    expect(kube.calls.filter((c) => c.startsWith('get')).length).toBe(gets + 1);
    expect(kube.watches).toHaveLength(3);
    expect(kube.watches[2]!.rv).toBe(String(kube.rv));
    // WATCH_RETRY: a second failure in a row waits twice as long; an event starts the sequence again.
    const waits = (ms: number) => timers.live().filter((t) => t.ms === ms).length;
    const twice = waits(2 * WATCH_RETRY.firstMs);
    kube.watches[2]!.onDone(new Error('HTTP 500'));
    expect(waits(2 * WATCH_RETRY.firstMs)).toBe(twice + 1);
    timers.fire(2 * WATCH_RETRY.firstMs);
    await settle();
    expect(kube.watches).toHaveLength(4);
    kube.event('MODIFIED');
    kube.watches[3]!.onDone(new Error('HTTP 500'));
    expect(waits(WATCH_RETRY.firstMs)).toBe(1);
    expect(waits(4 * WATCH_RETRY.firstMs)).toBe(0);
    u.stop();
    expect(waits(WATCH_RETRY.firstMs)).toBe(0); // the retry is cancelled with the rest
  });

  it('triggers during a run make exactly one more run after it', async () => {
    const kube = new FakeKube();
    let release!: () => void;
    let calls = 0;
    const { u } = updater(kube, {
      now: OUTSIDE,
      channel: () => {
        calls++;
        return new Promise((resolve) => (release = () => resolve({ version: 'v17.0.1', critical: false })));
      },
    });
    const first = u.start();
    const second = u.reconcile('event');
    const third = u.reconcile('trigger-event');
    await settle();
    release();
    await first;
    await settle();
    release();
    await Promise.all([second, third]);
    await settle();
    expect(calls).toBe(2);
    u.stop();
  });
});

describe("the updater's last result on /metrics (gateway_kube_updater_*)", () => {
  const scrape = async () => parseExposition(await registry.metrics());
  const oneHot = async () => (await scrape()).filter((s) => s.name === 'gateway_kube_updater_last_result' && s.value === 1).map((s) => s.labels.result);
  beforeAll(() => enableMetrics());
  afterAll(() => enableMetrics(false));

  it('upgraded, then up-to-date at the resync, then failed when the API refuses the PATCH; each with its reason and time', async () => {
    const kube = new FakeKube();
    const { u, timers } = updater(kube);
    await u.start();
    expect(await oneHot()).toEqual(['upgraded']);
    expect(sampleValue(await scrape(), 'gateway_kube_updater_last_run_timestamp_seconds', { result: 'upgraded', reason: 'in-window' })).toBe(Math.floor(IN_WINDOW.getTime() / 1000));
    timers.fire(RESYNC_INTERVAL_MS);
    await settle();
    await settle();
    expect(await oneHot()).toEqual(['up-to-date']);
    kube.current = workload('registry.example.com/gateway/gateway:17.0.1');
    kube.setImage = async () => {
      throw new Error('403 Forbidden');
    };
    timers.fire(RESYNC_INTERVAL_MS);
    await settle();
    await settle();
    expect(await oneHot()).toEqual(['failed']);
    // One run's series at a time: the earlier run's timestamp is gone.
    const runs = (await scrape()).filter((s) => s.name === 'gateway_kube_updater_last_run_timestamp_seconds');
    expect(runs.map((s) => s.labels)).toEqual([{ result: 'failed', reason: 'in-window' }]);
    u.stop();
  });

  it('maps every decision onto the upgraders\' closed set', () => {
    const skip = (reason: SkipReason): Decision => ({ action: 'skip', reason, message: '' });
    const update: Decision = { action: 'update', reason: 'in-window', message: '', current: 'v1.0.0', next: 'v1.0.1', container: 'gateway', image: 'x:1.0.1' };
    const ok = { dryRun: false, threw: false };
    expect(resultOf(update, ok)).toBe('upgraded');
    expect(resultOf(update, { dryRun: true, threw: false })).toBe('waiting');
    expect(resultOf(update, { dryRun: false, threw: true })).toBe('failed');
    expect(resultOf(undefined, ok)).toBe('failed');
    expect((['suspended', 'no-container', 'unknown-current', 'no-target', 'no-new-version', 'no-schedule', 'outside-window'] as const).map((r) => resultOf(skip(r), ok))).toEqual(['waiting', 'failed', 'failed', 'failed', 'up-to-date', 'failed', 'waiting']);
  });
});
