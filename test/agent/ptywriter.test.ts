import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as nodePty from 'node-pty';
import { afterEach, describe, expect, it } from 'vitest';
import { PtyWriter } from '../../src/agent/ssh.js';

/** A pausable source as the writer sees a channel: counts pauses and resumes. */
function source() {
  const s = { paused: false, pauses: 0, resumes: 0, pause: () => ((s.paused = true), s.pauses++), resume: () => ((s.paused = false), s.resumes++) };
  return s;
}

/** The pty's descriptor while node-pty's stream on it is open (as the agent gives it to the writer). */
const fdOf = (term: nodePty.IPty) => {
  const t = term as unknown as { fd: number; _socket: { destroyed: boolean } };
  expect(typeof t.fd).toBe('number');
  expect(typeof t._socket.destroyed).toBe('boolean');
  return () => (t._socket.destroyed ? undefined : t.fd);
};
const exited = (term: nodePty.IPty) => new Promise<void>((r) => term.onExit(() => r()));

let dir = '';
const terms: nodePty.IPty[] = [];
afterEach(async () => {
  for (const t of terms.splice(0)) t.kill('SIGKILL');
  if (dir) await rm(dir, { recursive: true, force: true });
});

/**
 * A program on a pty that copies n bytes of its input, raw (no echo, no line editing), to a file. It stops itself
 * (SIGSTOP) before it reads: the test writes while nothing drains the terminal, so its input buffer fills whatever
 * the machine's load, then sends SIGCONT. (Reading at once raced the writes: on a busy machine `head` drained the
 * terminal as fast as it was written and the queue never filled, one failure in a full run.)
 */
async function copier(n: number): Promise<{ term: nodePty.IPty; file: string; ready: Promise<void> }> {
  dir = await mkdtemp(join(tmpdir(), 'gw-ptywriter-'));
  const file = join(dir, 'out');
  const term = nodePty.spawn('/bin/sh', ['-c', `stty raw -echo; echo READY; kill -STOP $$; head -c ${n} > ${file}`], { encoding: null });
  terms.push(term);
  const ready = new Promise<void>((resolve) => {
    let seen = '';
    term.onData((d) => {
      seen += d.toString();
      if (seen.includes('READY')) resolve();
    });
  });
  return { term, file, ready };
}

/** Resolves once the process is stopped (state T in /proc/PID/stat), so that a SIGCONT cannot come before its SIGSTOP. */
async function stopped(pid: number): Promise<void> {
  const { readFileSync } = await import('node:fs');
  for (;;) {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    if (stat.slice(stat.lastIndexOf(')') + 2).startsWith('T')) return;
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('PtyWriter', () => {
  it('writes every byte in order, through a terminal whose input buffer fills (large paste)', async () => {
    const n = 512 * 1024;
    const { term, file, ready } = await copier(n);
    await ready;
    await stopped(term.pid);
    const src = source();
    const writer = new PtyWriter(fdOf(term), src);
    const data = Buffer.alloc(n);
    for (let i = 0; i < n; i++) data[i] = 97 + (i % 26);
    // In pieces, as SSH packets come: the later ones queue behind the first that did not fit.
    for (let off = 0; off < n; off += 32 * 1024) writer.write(data.subarray(off, off + 32 * 1024));
    process.kill(term.pid, 'SIGCONT');
    await exited(term);
    expect((await readFile(file)).equals(data)).toBe(true);
    // The queue went past its bound (the pty takes a few KiB at a time): the source was held, then let go.
    expect(src.pauses).toBeGreaterThan(0);
    expect(src.paused).toBe(false);
  });

  it('holds the source while the program does not read, and drops the input without throwing once it has gone (hostile: a pasting client, a program that never reads)', async () => {
    const term = nodePty.spawn('/bin/sh', ['-c', 'stty raw -echo; echo READY; sleep 30'], { encoding: null });
    terms.push(term);
    await new Promise<void>((resolve) => term.onData((d) => d.toString().includes('READY') && resolve()));
    const src = source();
    const writer = new PtyWriter(fdOf(term), src);
    for (let i = 0; i < 64; i++) writer.write(Buffer.alloc(16 * 1024, 120));
    expect(src.paused).toBe(true);
    term.kill('SIGKILL');
    await exited(term);
    // The terminal's far side is closed now (EIO): further input is dropped, nothing throws.
    writer.write(Buffer.from('more'));
    writer.close();
    writer.write(Buffer.from('after close'));
  });

  it('never writes to a descriptor once the terminal has closed it (its number may belong to another file by then)', async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-ptywriter-'));
    const term = nodePty.spawn('/bin/sh', ['-c', 'exit 0'], { encoding: null });
    terms.push(term);
    const fd = fdOf(term);
    const number = (term as unknown as { fd: number }).fd;
    await exited(term);
    expect(fd()).toBeUndefined();
    // Reuse the number the way a busy agent might: a file opened after the terminal closed gets the lowest free
    // number (POSIX), which is the terminal's.
    const { openSync, closeSync, readFileSync } = await import('node:fs');
    const file = join(dir, 'other');
    const other = openSync(file, 'w+');
    try {
      expect(other).toBe(number);
      const writer = new PtyWriter(fd, source());
      writer.write(Buffer.from('keystrokes'));
      expect(readFileSync(file, 'utf8')).toBe('');
    } finally {
      closeSync(other);
    }
  });
});
