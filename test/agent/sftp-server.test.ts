/**
 * The built-in sftp-server (`gateway sftp-server`, src/agent/sftp/), with no SSH at all: Debian's own `sftp`
 * client runs it directly over stdio (`sftp -D <command>`), and a raw client (test/helpers/sftp.ts) sends the
 * requests and bytes no real client sends. Runs as the user running the tests and, for permissions, as the user
 * `nobody` (setpriv: root only) in a fresh directory under /tmp that nobody can enter.
 *
 * Covered: put/get byte-exact (sha256), ls, mkdir/rmdir, rename, remove, symlink/readlink, status codes from
 * errno (no such file, permission denied), the handle and read limits, hostile input (garbage, a huge length,
 * a truncated packet, requests before INIT, random packets) that ends in an exit or an error status and never in
 * a hang or a crash, and bounded memory when the client floods requests the server cannot finish yet.
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, lstat, mkdir, mkdtemp, readlink, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, type RunResult } from '../helpers/gateway.js';
import { gatewayForAnyUser } from '../helpers/asuser.js';
import { FX, FXP, NO_ATTRS, PFLAG, bytesOf, firstName, packet, startRawServer, status, str, u32, u64 } from '../helpers/sftp.js';
import { rootTest } from '../helpers/root.js';

const NOBODY = 65534;
/** The user running the tests: root in CI; the server runs as this user unless a test says asNobody. */
const ME = process.getuid!();
// Tests that run the server as nobody need root to switch to that user; for other users they are skipped.
const itAsRoot = rootTest(['setuid']);
let root: string;

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** Debian's sftp client on a batch file, its server `gateway sftp-server` run directly (as nobody with asNobody). */
function sftpBatch(home: string, lines: string[], options: { asNobody?: boolean } = {}): Promise<RunResult> {
  // As nobody, from a copy of the build that nobody can read (the checkout may be under /root, mode 0700).
  const server = [process.execPath, options.asNobody ? gatewayForAnyUser() : BIN('gateway'), 'sftp-server'].join(' ');
  const command = options.asNobody ? `setpriv --reuid=${NOBODY} --regid=${NOBODY} --clear-groups -- ${server}` : server;
  const batch = join(root, `batch-${randomBytes(4).toString('hex')}`);
  return writeFile(batch, lines.join('\n') + '\n').then(
    () =>
      new Promise<RunResult>((resolve, reject) => {
        const child = spawn('sftp', ['-D', command, '-b', batch], { env: { PATH: process.env.PATH ?? '', HOME: home }, stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
        child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
        child.once('error', reject);
        child.once('close', (status) => resolve({ status, stdout, stderr }));
      }),
  );
}

/** A directory under root owned by uid (mode 0755 unless given). */
async function dirFor(name: string, uid: number, mode = 0o755): Promise<string> {
  const d = join(root, name);
  await mkdir(d);
  await chown(d, uid, uid);
  await chmod(d, mode);
  return d;
}

beforeAll(async () => {
  expect(existsSync(BIN('gateway')), 'run npm run build first: the tests run dist/cli/gateway.js').toBe(true);
  // Not under the checkout (it may be in a 0700 /root): nobody must be able to enter it.
  root = await mkdtemp('/tmp/gw-sftp-');
  await chmod(root, 0o755);
});

afterAll(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

describe('with the real sftp client (sftp -D)', () => {
  it('put and get are byte-exact; ls lists what is there', async () => {
    const home = await dirFor('home-put', ME);
    const local = join(root, 'up.bin');
    const data = randomBytes(8 * 1024 * 1024 + 123);
    await writeFile(local, data);
    const r = await sftpBatch(home, [`put ${local} up.bin`, 'ls -1', `get up.bin ${join(root, 'down.bin')}`]);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('sftp> ls -1\nup.bin\n');
    expect(sha256(readFileSync(join(home, 'up.bin')))).toBe(sha256(data));
    expect(sha256(readFileSync(join(root, 'down.bin')))).toBe(sha256(data));
  });

  it('mkdir, rename, ln -s, rm and rmdir', async () => {
    const home = await dirFor('home-ops', ME);
    await writeFile(join(home, 'a.txt'), 'a\n');
    const r = await sftpBatch(home, ['mkdir d', 'rename a.txt d/b.txt', 'ln -s d/b.txt link', 'ls -1 d', 'pwd']);
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('sftp> ls -1 d\nd/b.txt\n');
    expect(r.stdout).toContain(`Remote working directory: ${home}\n`);
    expect((await stat(join(home, 'd'))).isDirectory()).toBe(true);
    expect(existsSync(join(home, 'a.txt'))).toBe(false);
    expect(readFileSync(join(home, 'd/b.txt'), 'utf8')).toBe('a\n');
    // OpenSSH sends SYMLINK's paths in its own order; the link must point at the target, not the reverse.
    expect(await readlink(join(home, 'link'))).toBe('d/b.txt');

    const gone = await sftpBatch(home, ['rm link', 'rm d/b.txt', 'rmdir d', 'ls -1']);
    expect(gone.stderr).toBe('');
    expect(gone.status).toBe(0);
    expect(existsSync(join(home, 'd'))).toBe(false);
    expect((await lstat(join(home, 'link')).catch(() => undefined))).toBeUndefined();
  });

  itAsRoot('as nobody: its own files are its own; what the OS denies it is "Permission denied"', async () => {
    const home = await dirFor('home-nobody', NOBODY);
    const secret = await dirFor('secret', 0, 0o700);
    await writeFile(join(secret, 'key'), 'root only\n');
    const local = join(root, 'nobody-up.txt');
    await writeFile(local, 'from nobody\n', { mode: 0o644 });
    const r = await sftpBatch(
      home,
      [`put ${local} mine.txt`, `-get ${secret}/key ${join(root, 'stolen')}`, `-ls ${secret}`, `-put ${local} ${secret}/planted`, `-mkdir ${root}/not-mine`],
      { asNobody: true },
    );
    expect(r.status).toBe(0);
    expect((await stat(join(home, 'mine.txt'))).uid).toBe(NOBODY);
    expect(r.stderr.match(/Permission denied/g)?.length ?? 0).toBeGreaterThanOrEqual(3);
    expect(existsSync(join(root, 'stolen'))).toBe(false);
    expect(existsSync(join(secret, 'planted'))).toBe(false);
    expect(existsSync(join(root, 'not-mine'))).toBe(false);
  });
});

describe('status codes and limits (raw requests)', () => {
  itAsRoot('errno becomes the SFTP status: NO_SUCH_FILE, PERMISSION_DENIED, FAILURE with the reason', async () => {
    const home = await dirFor('home-codes', NOBODY);
    const secret = await dirFor('secret-codes', 0, 0o700);
    const s = await startRawServer(home, { asNobody: true });
    try {
      expect(status(await s.request(FXP.STAT, str('missing')))).toEqual({ code: FX.NO_SUCH_FILE, message: 'No such file' });
      expect(status(await s.request(FXP.OPEN, str(`${secret}/x`), u32(PFLAG.READ), NO_ATTRS)).code).toBe(FX.PERMISSION_DENIED);
      expect(status(await s.request(FXP.OPENDIR, str(secret))).code).toBe(FX.PERMISSION_DENIED);
      expect(status(await s.request(FXP.MKDIR, str(`${root}/nobody-dir`), NO_ATTRS)).code).toBe(FX.PERMISSION_DENIED);
      expect(status(await s.request(FXP.MKDIR, str('d'), NO_ATTRS)).code).toBe(FX.OK);
      expect(status(await s.request(FXP.MKDIR, str('d'), NO_ATTRS))).toEqual({ code: FX.FAILURE, message: 'File already exists' });
      await writeFile(join(home, 'd', 'f'), 'x');
      expect(status(await s.request(FXP.RMDIR, str('d')))).toEqual({ code: FX.FAILURE, message: 'Directory not empty' });
      // SFTP v3 RENAME never replaces a file.
      await writeFile(join(home, 'g'), 'y');
      expect(status(await s.request(FXP.RENAME, str('g'), str('d/f')))).toEqual({ code: FX.FAILURE, message: 'File exists' });
      expect(readFileSync(join(home, 'd', 'f'), 'utf8')).toBe('x');
      expect(status(await s.request(FXP.SYMLINK, str('target/elsewhere'), str('ln'))).code).toBe(FX.OK);
      expect(firstName(await s.request(FXP.READLINK, str('ln')))).toBe('target/elsewhere');
      expect(firstName(await s.request(FXP.REALPATH, str('d/../not-yet')))).toBe(join(home, 'not-yet'));
      expect(firstName(await s.request(FXP.REALPATH, str('')))).toBe(home);
    } finally {
      s.child.stdin!.end();
      expect((await s.exited).code).toBe(0);
    }
  });

  it('bad handles, offsets and paths are error statuses; reads are capped; at most 256 handles', async () => {
    const home = await dirFor('home-limits', ME);
    await writeFile(join(home, 'big'), randomBytes(1024 * 1024));
    const s = await startRawServer(home);
    try {
      expect(status(await s.request(FXP.READ, str(Buffer.from('nope')), u64(0n), u32(10)))).toEqual({ code: FX.FAILURE, message: 'Invalid handle' });
      expect(status(await s.request(FXP.CLOSE, str(Buffer.alloc(0)))).code).toBe(FX.FAILURE);
      expect(status(await s.request(FXP.OPEN, str('a\0b'), u32(PFLAG.READ), NO_ATTRS)).code).toBe(FX.BAD_MESSAGE);
      expect(status(await s.request(FXP.STAT, str('x'.repeat(5000)))).code).toBe(FX.BAD_MESSAGE);
      expect(status(await s.request(FXP.EXTENDED, str('posix-rename@openssh.com'), str('a'), str('b'))).code).toBe(FX.OP_UNSUPPORTED);

      const opened = await s.request(FXP.OPEN, str('big'), u32(PFLAG.READ), NO_ATTRS);
      expect(opened.type).toBe(FXP.HANDLE);
      const handle = bytesOf(opened);
      const huge = await s.request(FXP.READ, str(handle), u64(0n), u32(0xffffffff));
      expect(huge.type).toBe(FXP.DATA);
      expect(bytesOf(huge).length).toBe(256 * 1024 - 1024);
      expect(status(await s.request(FXP.READ, str(handle), u64(2n ** 63n), u32(10)))).toEqual({ code: FX.FAILURE, message: 'Offset out of range' });
      expect(status(await s.request(FXP.READ, str(handle), u64(2n ** 40n), u32(10))).code).toBe(FX.EOF);
      expect(status(await s.request(FXP.READDIR, str(handle))).message).toBe('Not a directory handle');
      expect(status(await s.request(FXP.CLOSE, str(handle))).code).toBe(FX.OK);
      expect(status(await s.request(FXP.READ, str(handle), u64(0n), u32(10))).message).toBe('Invalid handle');

      const handles = await Promise.all(Array.from({ length: 257 }, () => s.request(FXP.OPENDIR, str('.'))));
      expect(handles.slice(0, 256).every((r) => r.type === FXP.HANDLE)).toBe(true);
      expect(status(handles[256]!)).toEqual({ code: FX.FAILURE, message: 'Too many open handles (at most 256)' });
      expect(status(await s.request(FXP.CLOSE, str(bytesOf(handles[0]!)))).code).toBe(FX.OK);
      expect((await s.request(FXP.OPEN, str('big'), u32(PFLAG.READ), NO_ATTRS)).type).toBe(FXP.HANDLE);
    } finally {
      s.child.stdin!.end();
      expect((await s.exited).code).toBe(0);
    }
  });
});

describe('hostile input: an exit or an error status, never a hang or a crash', () => {
  const protocolError = (r: { code: number | null; stderr: string }) => {
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_SFTP_PROTOCOL');
    expect(r.stderr).not.toMatch(/GW_ERR_INTERNAL|\n\s+at /);
  };

  it('a length field over 256 KiB: it stops at once, with its input still open', async () => {
    const a = await startRawServer(await dirFor('home-huge', ME));
    a.send(Buffer.concat([u32(1024 * 1024), Buffer.from([FXP.OPEN])]));
    const r = await a.exited;
    protocolError(r);
    expect(r.stderr).toContain('exceeds max length');
    // 2^31 and more: ssh2's parser reads it as a negative number and throws; still a protocol error, no crash.
    const b = await startRawServer(await dirFor('home-huger', ME));
    b.send(Buffer.from([0xff, 0xff, 0xff, 0xff, FXP.OPEN]));
    const r2 = await b.exited;
    protocolError(r2);
    expect(r2.stderr).toContain('malformed packet');
  });

  it('garbage instead of INIT, and requests before INIT', async () => {
    const a = await startRawServer(await dirFor('home-garbage', ME), { init: false });
    a.send(Buffer.concat([u32(64), randomBytes(64)]));
    protocolError(await a.exited);
    const b = await startRawServer(await dirFor('home-noinit', ME), { init: false });
    b.send(packet(FXP.OPEN, u32(1), str('x'), u32(PFLAG.READ), NO_ATTRS));
    const r = await b.exited;
    protocolError(r);
    expect(r.stderr).toContain('Expected INIT packet');
  });

  it('a request whose fields run past its end, and an unknown packet type', async () => {
    const a = await startRawServer(await dirFor('home-malformed', ME));
    a.send(packet(FXP.OPEN, u32(1), u32(1000), Buffer.from('short')));
    protocolError(await a.exited);
    const b = await startRawServer(await dirFor('home-unknown', ME));
    b.send(packet(99, u32(1)));
    protocolError(await b.exited);
  });

  it('a packet cut short by the end of the input: a clean exit', async () => {
    const s = await startRawServer(await dirFor('home-truncated', ME));
    s.send(packet(FXP.STAT, u32(1), str('.')).subarray(0, 9));
    s.child.stdin!.end();
    expect(await s.exited).toMatchObject({ code: 0, stderr: '' });
  });

  itAsRoot('random packets (as nobody): every run ends in a clean exit or GW_ERR_SFTP_PROTOCOL', async () => {
    const home = await dirFor('home-fuzz', NOBODY);
    const types = Object.values(FXP).filter((t) => t < 101 || t === 200);
    const field = fc.oneof(
      fc.integer({ min: 0, max: 0xffffffff }).map(u32),
      fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map(u64),
      fc.oneof(fc.string({ maxLength: 12 }), fc.uint8Array({ maxLength: 8 }).map((a) => Buffer.from(a))).map(str),
      fc.uint8Array({ maxLength: 16 }).map((a) => Buffer.from(a)),
    );
    const request = fc.oneof(
      fc.tuple(fc.constantFrom(...types), fc.array(field, { maxLength: 5 })).map(([t, fields]) => packet(t, ...fields)),
      fc.uint8Array({ minLength: 1, maxLength: 32 }).map((a) => Buffer.from(a)), // bytes with no framing at all
    );
    await fc.assert(
      fc.asyncProperty(fc.array(request, { minLength: 1, maxLength: 12 }), async (packets) => {
        const s = await startRawServer(home, { asNobody: true });
        for (const p of packets) s.send(p);
        s.child.stdin!.end();
        const r = await s.exited;
        if (r.code !== 0) protocolError(r);
        else expect(r.stderr).toBe('');
      }),
      { numRuns: 25 },
    );
  }, 120_000);
});

describe('bounded memory', () => {
  /** Peak and current resident memory of a process, in bytes (/proc/<pid>/status). */
  const memory = (pid: number) => {
    const text = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text)![1]) * 1024;
    return { peak: kb('VmHWM'), now: kb('VmRSS') };
  };

  it('a flood of writes behind a request that blocks: the server stops reading, its memory does not grow with it', async () => {
    const home = await dirFor('home-flood', ME);
    const fifo = join(home, 'fifo');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    const s = await startRawServer(home);
    let reader: ReturnType<typeof spawn> | undefined;
    try {
      const handle = bytesOf(await s.request(FXP.OPEN, str('file'), u32(PFLAG.WRITE | PFLAG.CREAT), NO_ATTRS));
      const before = memory(s.child.pid!).now;
      // Opening a FIFO for writing blocks until it has a reader: every request after this one waits.
      const blocked = s.request(FXP.OPEN, str('fifo'), u32(PFLAG.WRITE), NO_ATTRS);
      const chunk = randomBytes(255 * 1024);
      const FLOOD = 800; // 200 MiB
      const replies = Array.from({ length: FLOOD }, (_, i) => s.request(FXP.WRITE, str(handle), u64(BigInt(i) * BigInt(chunk.length)), str(chunk)));
      // Wait until the server has taken all it is going to take: what it has not read stays in our buffer.
      let last = -1;
      for (let same = 0; same < 10; ) {
        await new Promise((r) => setTimeout(r, 100));
        const pending = s.child.stdin!.writableLength;
        same = pending === last ? same + 1 : 0;
        last = pending;
      }
      expect(last).toBeGreaterThan(100 * 1024 * 1024); // most of the flood was never read
      expect(memory(s.child.pid!).peak - before).toBeLessThan(64 * 1024 * 1024);
      reader = spawn('cat', [fifo], { stdio: ['ignore', 'ignore', 'ignore'] });
      expect((await blocked).type).toBe(FXP.HANDLE);
      const codes = (await Promise.all(replies)).map((r) => status(r).code);
      expect(codes.every((c) => c === FX.OK)).toBe(true);
      expect((await stat(join(home, 'file'))).size).toBe(FLOOD * chunk.length);
    } finally {
      reader ??= spawn('cat', [fifo], { stdio: ['ignore', 'ignore', 'ignore'] }); // unblocks the server if a check failed early
      s.child.stdin!.end();
      await s.exited;
      reader.kill('SIGKILL');
    }
  }, 120_000);
});
