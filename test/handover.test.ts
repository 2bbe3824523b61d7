/**
 * src/handover.ts with real child processes (a few lines of Node.js standing in for the successor) and the pid
 * file's takeFrom (src/reload.ts): a successor that says ready, one that exits, one that says too much, one that
 * never says anything (the deadline), the predecessor named only when it is the parent, one hand-over at a time,
 * and a failed one giving the tunnels back.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GatewayError } from '../src/errors.js';
import { Handover, HANDOVER_FROM_ENV, LAUNCHER_ENV, predecessorOf, startSuccessor, successorCommand } from '../src/handover.js';
import { acquirePidFile } from '../src/reload.js';

/** A successor stand-in: runs `body` with fd 3 being the readiness pipe. */
const successor = (body: string, readyTimeoutMs = 30_000) => startSuccessor({ command: process.execPath, args: ['-e', body], env: { PATH: process.env.PATH ?? '' }, readyTimeoutMs });

async function refusal(p: Promise<unknown>): Promise<GatewayError> {
  const err = await p.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(GatewayError);
  return err as GatewayError;
}

describe('startSuccessor', () => {
  it('resolves once the successor writes "ready" to its fd 3, and it sees who it takes over from', async () => {
    const child = await successor(`require('fs').writeSync(3, 'ready\\n'); require('fs').closeSync(3); if (process.env.${HANDOVER_FROM_ENV} !== String(process.ppid)) process.exit(3); setTimeout(() => {}, 200);`);
    const code = await new Promise((resolve) => child.once('exit', resolve));
    expect(code).toBe(0);
  });

  it('a successor that exits before it is ready: GW_ERR_HANDOVER_FAILED naming how', async () => {
    const e = await refusal(successor('process.exit(7)'));
    expect(e.code).toBe('GW_ERR_HANDOVER_FAILED');
    expect(e.message).toMatch(/exited|closed its readiness pipe/);
  });

  it('hostile: a successor that writes more than the word is refused and killed', async () => {
    const e = await refusal(successor(`require('fs').writeSync(3, 'x'.repeat(100000)); setInterval(() => {}, 1000);`));
    expect(e.code).toBe('GW_ERR_HANDOVER_FAILED');
    expect(e.message).toContain('more than a word');
  });

  it('hostile: a successor that never says ready is killed at the deadline', async () => {
    const e = await refusal(successor('setInterval(() => {}, 1000);', 500));
    expect(e.code).toBe('GW_ERR_HANDOVER_FAILED');
    expect(e.message).toContain('not ready within 500 ms');
  });
});

describe('successorCommand: the command as installed now', () => {
  const argv = ['/opt/gw/lib/gateway/17.0.0/node', '/opt/gw/lib/gateway/17.0.0/dist/cli/gateway.js', 'start', '-c', '/etc/gateway.yaml'];
  it('a packaged gateway: its bin wrapper (which names the new version after an upgrade), with the arguments', () => {
    expect(successorCommand({ [LAUNCHER_ENV]: '/usr/local/bin/gateway' }, argv[0]!, ['--enable-fips'], argv)).toEqual({ command: '/usr/local/bin/gateway', args: ['start', '-c', '/etc/gateway.yaml'] });
  });
  it('no wrapper, or a relative one: this process\'s own command, its flags first', () => {
    for (const env of [{}, { [LAUNCHER_ENV]: 'bin/gateway' }, { [LAUNCHER_ENV]: '' }]) {
      expect(successorCommand(env, argv[0]!, ['--enable-fips'], argv)).toEqual({ command: argv[0], args: ['--enable-fips', ...argv.slice(1)] });
    }
  });
  it('startSuccessor runs the launcher the environment names', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'gw-launcher-'));
    const launcher = join(dir, 'launcher.sh');
    await writeFile(launcher, '#!/bin/sh\necho "$GATEWAY_HANDOVER_FROM" > "$0.ran"\necho ready >&3\nsleep 30\n', { mode: 0o755 });
    const child = await startSuccessor({ env: { PATH: process.env.PATH ?? '', [LAUNCHER_ENV]: launcher } });
    child.kill('SIGKILL');
    const ran = readFileSync(`${launcher}.ran`, 'utf8').trim();
    await rm(dir, { recursive: true, force: true });
    expect(ran).toBe(String(process.pid));
  });
});

describe('predecessorOf', () => {
  it('names the predecessor only when it is the parent, and only a pid', () => {
    expect(predecessorOf({}, 100)).toBeUndefined();
    expect(predecessorOf({ [HANDOVER_FROM_ENV]: '101' }, 100)).toBeUndefined(); // not the parent: a stray variable
    expect(predecessorOf({ [HANDOVER_FROM_ENV]: '100; rm -rf /' }, 100)).toBeUndefined();
    expect(predecessorOf({ [HANDOVER_FROM_ENV]: '1' }, 1)).toBeUndefined(); // reparented to init: the parent is gone
    expect(predecessorOf({ [HANDOVER_FROM_ENV]: '100' }, 100)?.pid).toBe(100);
  });
});

describe('Handover', () => {
  it('one at a time: a second ask while the successor starts is GW_ERR_HANDOVER_BUSY; a failure gives the tunnels back', async () => {
    const held: boolean[] = [];
    let undone = 0;
    let fail!: (e: Error) => void;
    const h = new Handover({
      hold: (on) => held.push(on),
      release: async () => ({ undo: async () => void undone++ }),
      startSuccessor: () => new Promise((_, reject) => (fail = reject)),
    });
    const first = h.handOver();
    await new Promise((r) => setImmediate(r));
    const second = await h.handOver();
    expect(second.ok).toBe(false);
    expect(!second.ok && second.error.code).toBe('GW_ERR_HANDOVER_BUSY');
    fail(new GatewayError('GW_ERR_HANDOVER_FAILED', 'it exited'));
    const outcome = await first;
    expect(!outcome.ok && outcome.error.code).toBe('GW_ERR_HANDOVER_FAILED');
    expect(held).toEqual([true, false]);
    expect(undone).toBe(1);
    expect(h.state).toBe('serving');
  });

  it('once ready the process drains: a later ask is refused', async () => {
    const h = new Handover({ hold: () => undefined, startSuccessor: async () => ({ pid: 4321 }) as never });
    expect(await h.handOver()).toEqual({ ok: true, pid: 4321 });
    const again = await h.handOver();
    expect(!again.ok && again.error.code).toBe('GW_ERR_HANDOVER_BUSY');
  });
});

describe('the pid file on a hand-over (takeFrom)', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-handover-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('the successor takes the file from the pid it names, and from no other live gateway', async () => {
    // A live process whose command line says gateway: what the pid file's holder check believes.
    const holder = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)', 'gateway']);
    try {
      const path = join(dir, 'gateway.pid');
      acquirePidFile(path, { pid: holder.pid! });
      expect(() => acquirePidFile(path, { pid: 7001, takeFrom: 7000 })).toThrow(expect.objectContaining({ code: 'GW_ERR_PID_FILE_BUSY' }));
      const taken = acquirePidFile(path, { pid: 7002, takeFrom: holder.pid! });
      expect(readFileSync(path, 'utf8')).toBe('7002\n');
      taken.release();
    } finally {
      holder.kill('SIGKILL');
    }
  });
});
