/**
 * The schedule the agent exports: the text format (round trip, malformed files), ownership checks for a non-root
 * agent (real files; the agent user is "nobody" when the tests run as root, as CI does, else the user running
 * them), the Kubernetes JSON form, and the export loop.
 */
import { chmod, chown, mkdir, mkdtemp, readFile, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import type { ClusterMaintenanceConfig } from '../../src/auth/resources/types.js';
import {
  checkScheduleFile,
  formatKubeSchedule,
  formatSchedule,
  parseKubeSchedule,
  parseSchedule,
  readSchedule,
  startScheduleExport,
  writeKubeSchedule,
  writeSchedule,
} from '../../src/upgrade/schedule.js';
import { nextWindows, type Window } from '../../src/upgrade/windows.js';
import { runAsUser, src, UNPRIVILEGED_USER } from '../helpers/asuser.js';
import { rootTest } from '../helpers/root.js';

setRootLogger(createLogger({ level: 'silent' }));

const NOBODY = 65534;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-schedule-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const W = (a: string, b: string): Window => ({ start: new Date(a), stop: new Date(b) });
function config(hour: number, weekdays: string[]): ClusterMaintenanceConfig {
  return {
    kind: 'cluster_maintenance_config',
    version: 'v1',
    metadata: { name: 'cluster-maintenance-config' },
    spec: { agent_upgrades: { utc_start_hour: hour, weekdays: weekdays as never } },
  } as ClusterMaintenanceConfig;
}

describe('the text format', () => {
  it('is a comment line, then "<start-unix> <stop-unix>" per window', () => {
    const text = formatSchedule([W('2026-01-06T02:00:00Z', '2026-01-06T03:00:00Z'), W('2026-01-05T02:00:00Z', '2026-01-05T03:00:00Z')], new Date('2026-01-05T00:00:00Z'));
    expect(text).toBe(
      '# gateway-upgrade schedule v1: "<start> <stop>" per line, Unix seconds (UTC); written 2026-01-05T00:00:00Z\n' +
        '1767578400 1767582000\n' +
        '1767664800 1767668400\n',
    );
  });

  it('round-trips (property)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 0, max: 4_000_000_000 }), fc.integer({ min: 1, max: 86_400 })), { maxLength: 20 }),
        (pairs) => {
          const windows = pairs.map(([s, len]) => ({ start: new Date(s * 1000), stop: new Date((s + len) * 1000) }));
          const parsed = parseSchedule(formatSchedule(windows));
          expect(parsed.ok).toBe(true);
          if (parsed.ok) expect(parsed.windows.map((w) => [w.start.getTime(), w.stop.getTime()]).sort((a, b) => a[0]! - b[0]!)).toEqual(windows.map((w) => [w.start.getTime(), w.stop.getTime()]).sort((a, b) => a[0]! - b[0]!));
        },
      ),
    );
  });

  it.each([
    ['', 'empty'],
    ['1767578400 1767582000\n', 'first line'],
    ['# c\n1767578400\n', 'line 2'],
    ['# c\n1767582000 1767578400\n', 'stops before it starts'],
    ['# c\nabc def\n', 'line 2'],
  ])('refuses %j (%s)', (text, why) => {
    const r = parseSchedule(text);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.problem).toContain(why);
  });

  it('parses a header-only file as "no window" and ignores blank and comment lines', () => {
    expect(parseSchedule('# only the header\n')).toEqual({ ok: true, windows: [] });
    const r = parseSchedule('# h\n\n# note\n1767578400   1767582000\r\n');
    expect(r.ok && r.windows.length).toBe(1);
  });
});

describe('readSchedule', () => {
  it('missing, stale, empty and valid files', async () => {
    const now = new Date('2026-01-05T02:30:00Z');
    const p = join(dir, 'read', 'schedule');
    expect(await readSchedule(p, now)).toMatchObject({ state: 'invalid', problem: `${p} does not exist` });
    await writeSchedule(join(dir, 'read'), [W('2026-01-04T02:00:00Z', '2026-01-04T03:00:00Z')]);
    expect(await readSchedule(p, now)).toMatchObject({ state: 'invalid', problem: expect.stringContaining('stale') });
    await writeSchedule(join(dir, 'read'), []);
    expect((await readSchedule(p, now)).state).toBe('empty');
    await writeSchedule(join(dir, 'read'), [W('2026-01-05T02:00:00Z', '2026-01-05T03:00:00Z')]);
    const ok = await readSchedule(p, now);
    expect(ok).toMatchObject({ state: 'ok', old: false });
    await utimes(p, new Date('2020-01-01'), new Date('2020-01-01'));
    expect(await readSchedule(p, now)).toMatchObject({ state: 'ok', old: true });
  });
});

describe('ownership for a non-root agent', () => {
  it('root needs nothing', async () => {
    expect(await checkScheduleFile(join(dir, 'nothing-here'), { uid: 0 })).toBeUndefined();
  });

  it('a missing file: says so and how to create it for the agent user', async () => {
    const d = join(dir, 'own-missing');
    const p = await checkScheduleFile(d, { uid: NOBODY, user: 'gwagent' });
    expect(p?.problem).toContain(`${d}/schedule does not exist`);
    expect(p?.problem).toContain('gwagent (uid 65534)');
    expect(p?.fix).toBe(`sudo install -d -m 0755 ${d} && sudo install -o gwagent -m 0644 /dev/null ${d}/schedule`);
  });

  it('a file of another user: says whose and the chown that fixes it', async () => {
    const d = join(dir, 'own-wrong');
    await mkdir(d);
    await writeFile(join(d, 'schedule'), '');
    const me = userInfo();
    const p = await checkScheduleFile(d, { uid: NOBODY, user: 'gwagent' });
    expect(p?.problem).toContain(`belongs to ${me.username} (uid ${me.uid}), not to the agent user gwagent (uid 65534)`);
    expect(p?.fix).toBe(`sudo chown gwagent ${d}/schedule`);
  });

  it("the agent user's own file is fine; read-only, the fix is chmod u+w", async () => {
    const agent = UNPRIVILEGED_USER;
    const d = join(dir, 'own-right');
    await mkdir(d);
    await writeFile(join(d, 'schedule'), '');
    await chown(join(d, 'schedule'), agent.uid, agent.gid);
    expect(await checkScheduleFile(d, { uid: agent.uid, user: 'gwagent' })).toBeUndefined();
    await chmod(join(d, 'schedule'), 0o444);
    expect((await checkScheduleFile(d, { uid: agent.uid, user: 'gwagent' }))?.fix).toBe(`sudo chmod u+w ${d}/schedule`);
  });

  it('a non-root agent rewrites its own file in place in a directory it cannot write', async () => {
    const agent = UNPRIVILEGED_USER;
    const d = join(dir, 'own-inplace');
    await mkdir(d);
    await writeFile(join(d, 'schedule'), '');
    await chown(join(d, 'schedule'), agent.uid, agent.gid);
    await chmod(dir, 0o755);
    await chmod(d, 0o555); // the agent cannot create files here (as root: the directory is root's besides)
    try {
      // The writer runs as the agent user in a child process, from a bundle that user can read wherever the
      // checkout is.
      const script = `
        import { writeSchedule } from ${JSON.stringify(src('upgrade/schedule.ts'))};
        await writeSchedule(${JSON.stringify(d)}, [{ start: new Date('2026-01-05T02:00:00Z'), stop: new Date('2026-01-05T03:00:00Z') }]);
      `;
      const r = runAsUser({ script, uid: agent.uid, gid: agent.gid });
      expect(r.stderr).toBe('');
      expect(r.status).toBe(0);
      const st = await stat(join(d, 'schedule'));
      expect(st.uid).toBe(agent.uid);
      expect(await readFile(join(d, 'schedule'), 'utf8')).toContain('1767578400 1767582000');
    } finally {
      await chmod(d, 0o755); // so that the clean-up can remove the file
    }
  });

  rootTest(['chown'])('root writing for an agent user gives the file to that user', async () => {
    const d = join(dir, 'own-chown');
    await writeSchedule(d, [], { uid: NOBODY, gid: NOBODY });
    expect((await stat(join(d, 'schedule'))).uid).toBe(NOBODY);
  });
});

describe('the Kubernetes form', () => {
  it('is JSON with ISO instants and parses back', async () => {
    const ws = [W('2026-01-05T02:00:00Z', '2026-01-05T03:00:00Z')];
    expect(formatKubeSchedule(ws, new Date('2026-01-01T00:00:00Z'))).toEqual({
      version: 'v1',
      written: '2026-01-01T00:00:00Z',
      windows: [{ start: '2026-01-05T02:00:00Z', stop: '2026-01-05T03:00:00Z' }],
    });
    const p = join(dir, 'kube', 'state.json');
    await writeKubeSchedule(p, ws);
    expect(parseKubeSchedule(await readFile(p, 'utf8'))).toEqual(ws);
    expect(() => parseKubeSchedule('{"version":"v2"}')).toThrow(/not valid/);
  });
});

describe('startScheduleExport', () => {
  it('exports at start, after refresh() (a configuration change) and every interval', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      const d = join(dir, 'export');
      const kube = join(dir, 'export-kube', 'state.json');
      let current: ClusterMaintenanceConfig | undefined = config(2, ['Mon']);
      let calls = 0;
      const now = new Date('2026-01-01T00:00:00Z');
      const exp = startScheduleExport({
        fetchConfig: async () => {
          calls++;
          return current;
        },
        dir: d,
        kubeStatePath: kube,
        intervalMs: 60_000,
        count: 3,
        clock: () => now,
        uid: 0,
      });
      await exp.ready;
      expect(exp.problem).toBeUndefined();
      const first = parseSchedule(await readFile(join(d, 'schedule'), 'utf8'));
      expect(first.ok && first.windows).toEqual(nextWindows(config(2, ['Mon']), now, 3));
      expect(parseKubeSchedule(await readFile(kube, 'utf8'))).toEqual(nextWindows(config(2, ['Mon']), now, 3));

      current = config(5, ['*']);
      await exp.refresh();
      const second = parseSchedule(await readFile(join(d, 'schedule'), 'utf8'));
      expect(second.ok && second.windows[0]!.start.toISOString()).toBe('2026-01-01T05:00:00.000Z');

      const before = calls;
      current = undefined; // the configuration was removed: an export with no window
      await vi.advanceTimersByTimeAsync(60_000);
      await exp.refresh();
      expect(calls).toBeGreaterThan(before + 1);
      expect(await readFile(join(d, 'schedule'), 'utf8')).toContain('no maintenance window is configured');
      exp.stop();
      const stoppedAt = calls;
      await vi.advanceTimersByTimeAsync(10 * 60_000);
      expect(calls).toBe(stoppedAt);
    } finally {
      vi.useRealTimers();
    }
  });

  it('checks the file at start for a non-root agent and reports the fix, and keeps the old file when the Auth Service fails', async () => {
    const d = join(dir, 'export-nonroot');
    const exp = startScheduleExport({ fetchConfig: async () => config(1, ['*']), dir: d, uid: NOBODY, intervalMs: 3_600_000 });
    await exp.ready;
    exp.stop();
    expect(exp.problem?.fix).toContain('install -o');

    const d2 = join(dir, 'export-fail');
    let fail = false;
    const exp2 = startScheduleExport({
      fetchConfig: async () => {
        if (fail) throw new Error('auth unreachable');
        return config(1, ['*']);
      },
      dir: d2,
      uid: 0,
      intervalMs: 3_600_000,
    });
    await exp2.ready;
    const before = await readFile(join(d2, 'schedule'), 'utf8');
    fail = true;
    expect(await exp2.refresh()).toBeUndefined();
    expect(await readFile(join(d2, 'schedule'), 'utf8')).toBe(before);
    exp2.stop();
  });

  it('hands the Kubernetes form to a writer (the updater\'s Secret)', async () => {
    const written: string[] = [];
    const exp = startScheduleExport({ fetchConfig: async () => config(4, ['Sun']), writeKubeState: async (json) => void written.push(json), clock: () => new Date('2026-01-01T00:00:00Z'), count: 1, intervalMs: 3_600_000 });
    await exp.ready;
    exp.stop();
    expect(written).toHaveLength(1);
    expect(parseKubeSchedule(written[0]!)).toEqual([W('2026-01-04T04:00:00Z', '2026-01-04T05:00:00Z')]);
  });

  it('does not enroll (exports nothing) when the cluster is too old', async () => {
    const d = join(dir, 'export-old');
    const exp = startScheduleExport({ fetchConfig: async () => config(1, ['*']), dir: d, uid: 0, clusterVersion: async () => '14.3.6', intervalMs: 3_600_000 });
    await exp.ready;
    exp.stop();
    await expect(stat(join(d, 'schedule'))).rejects.toThrow(/ENOENT/);
  });
});
