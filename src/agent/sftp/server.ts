/**
 * The built-in sftp-server: SFTP version 3 on standard input and output, run by the SSH Service as the login
 * user (`gateway sftp-server`), so every file operation has exactly that user's permissions.
 *
 * It answers what OpenSSH's sftp and scp send: OPEN, CLOSE, READ, WRITE, LSTAT, FSTAT, STAT, SETSTAT, FSETSTAT,
 * OPENDIR, READDIR, REMOVE, MKDIR, RMDIR, REALPATH, RENAME, READLINK and SYMLINK; extensions are not offered
 * (ssh2 answers any EXTENDED request with OP_UNSUPPORTED). Requests are handled one at a time, in order, as
 * OpenSSH's sftp-server does; at most LIMITS.queuedRequests wait, after which the input is not read until they
 * are answered, and replies that the output cannot take yet stop the input too (stdio.ts): a client that sends
 * without reading cannot make the server's memory grow.
 */
import { lstat, mkdir, open, opendir, readFile, readlink, realpath, rename, rmdir, stat, symlink, unlink, chmod, chown, truncate, utimes, type FileHandle } from 'node:fs/promises';
import type { Dir, Stats } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import type { FileEntry, SFTPWrapper } from 'ssh2';
import { HandleTable } from './handles.js';
import { LIMITS, STATUS, attrChanges, attrsOf, longname, namesById, openFlags, resolvePath, statusForError, validOffset, type ReplyAttrs, type RequestAttrs } from './posix.js';
import { sftpOnStreams, type StdioSftp } from './stdio.js';

type Opened = { kind: 'file'; fh: FileHandle } | { kind: 'dir'; dir: Dir; path: string };

/** A request the client got wrong: answered with this status, not with an errno's. */
class Refusal extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

export interface SftpServerOptions {
  /** Relative paths are relative to this directory (the login user's home). */
  home: string;
  /** For the `ls -l` lines of directory listings; read from /etc/passwd and /etc/group when absent. */
  users?: Map<number, string>;
  groups?: Map<number, string>;
}

/** Serves SFTP on input/output until the input ends; resolves with the error that stopped it, if any. */
export async function runSftpServer(input: Readable, output: Writable, options: SftpServerOptions): Promise<Error | undefined> {
  const names = await idNames(options); // before the input is read: requests need their handlers
  const io = sftpOnStreams(input, output);
  const session = new SftpSession(io, options.home, names);
  const failure = await io.done;
  await session.finish(failure !== undefined);
  io.close();
  return failure;
}

async function idNames(options: SftpServerOptions): Promise<{ users: Map<number, string>; groups: Map<number, string> }> {
  const read = (file: string) => readFile(file, 'utf8').then(namesById, () => new Map<number, string>());
  return { users: options.users ?? (await read('/etc/passwd')), groups: options.groups ?? (await read('/etc/group')) };
}

class SftpSession {
  private readonly sftp: SFTPWrapper;
  private readonly handles = new HandleTable<Opened>(LIMITS.handles);
  private readonly queue: Array<() => Promise<void>> = [];
  private running: Promise<void> | undefined;

  constructor(
    private readonly io: StdioSftp,
    private readonly home: string,
    private readonly idNames: { users: Map<number, string>; groups: Map<number, string> },
  ) {
    this.sftp = io.sftp;
    const on = <A extends unknown[]>(event: string, op: (id: number, ...args: A) => Promise<void>) =>
      this.sftp.on(event, (id: number, ...args: A) => this.enqueue(id, () => op.call(this, id, ...args)));
    on('OPEN', this.open);
    on('CLOSE', this.close);
    on('READ', this.read);
    on('WRITE', this.write);
    on('LSTAT', (id, path: string) => this.stat(id, path, lstat));
    on('STAT', (id, path: string) => this.stat(id, path, stat));
    on('FSTAT', this.fstat);
    on('SETSTAT', this.setstat);
    on('FSETSTAT', this.fsetstat);
    on('OPENDIR', this.opendir);
    on('READDIR', this.readdir);
    on('REMOVE', (id, path: string) => this.pathOp(id, path, unlink));
    on('RMDIR', (id, path: string) => this.pathOp(id, path, rmdir));
    on('MKDIR', this.mkdir);
    on('REALPATH', this.realpath);
    on('RENAME', this.rename);
    on('READLINK', this.readlink);
    on('SYMLINK', this.symlink);
  }

  /** Answers what was received (unless the protocol failed), then closes every handle still open. */
  async finish(failed: boolean): Promise<void> {
    if (failed) this.queue.length = 0;
    await this.running;
    await Promise.allSettled(this.handles.takeAll().map((o) => (o.kind === 'file' ? o.fh.close() : o.dir.close())));
  }

  private enqueue(id: number, task: () => Promise<void>): void {
    this.queue.push(async () => {
      try {
        await task();
      } catch (err) {
        const s = err instanceof Refusal ? { code: err.code, message: err.message } : statusForError(err);
        this.sftp.status(id, s.code, s.message);
      }
    });
    if (this.queue.length >= LIMITS.queuedRequests) this.io.hold('queue');
    this.running ??= this.drain();
  }

  private async drain(): Promise<void> {
    for (let task = this.queue.shift(); task; task = this.queue.shift()) {
      await task();
      if (this.queue.length < LIMITS.queuedRequests) this.io.release('queue');
    }
    this.running = undefined;
  }

  private path(path: unknown): string {
    const resolved = typeof path === 'string' ? resolvePath(this.home, path) : undefined;
    if (resolved === undefined) throw new Refusal(STATUS.BAD_MESSAGE, 'Bad path');
    return resolved;
  }

  private opened<K extends Opened['kind']>(handle: Buffer, kind: K): Extract<Opened, { kind: K }> {
    const o = this.handles.get(handle);
    if (!o) throw new Refusal(STATUS.FAILURE, 'Invalid handle');
    if (o.kind !== kind) throw new Refusal(STATUS.FAILURE, kind === 'file' ? 'Not a file handle' : 'Not a directory handle');
    return o as Extract<Opened, { kind: K }>;
  }

  private ok(id: number): void {
    this.sftp.status(id, STATUS.OK);
  }

  /** A NAME reply. ssh2 sends only the attributes present, though its types want all of them. */
  private nameReply(id: number, entries: Array<{ filename: string; longname: string; attrs: Partial<ReplyAttrs> }>): void {
    this.sftp.name(id, entries as FileEntry[]);
  }

  private giveHandle(id: number, opened: Opened): Buffer | undefined {
    const handle = this.handles.add(opened);
    if (handle) this.sftp.handle(id, handle);
    return handle;
  }

  private async open(id: number, filename: string, pflags: number, attrs: RequestAttrs): Promise<void> {
    const path = this.path(filename);
    if (this.handles.size >= LIMITS.handles) throw new Refusal(STATUS.FAILURE, `Too many open handles (at most ${LIMITS.handles})`);
    const mode = typeof attrs?.mode === 'number' ? attrs.mode & 0o7777 : 0o666;
    const fh = await open(path, openFlags(pflags >>> 0), mode);
    if (!this.giveHandle(id, { kind: 'file', fh })) await fh.close();
  }

  private async close(id: number, handle: Buffer): Promise<void> {
    const o = this.handles.take(handle);
    if (!o) throw new Refusal(STATUS.FAILURE, 'Invalid handle');
    await (o.kind === 'file' ? o.fh.close() : o.dir.close());
    this.ok(id);
  }

  private async read(id: number, handle: Buffer, offset: number, len: number): Promise<void> {
    const { fh } = this.opened(handle, 'file');
    if (!validOffset(offset)) throw new Refusal(STATUS.FAILURE, 'Offset out of range');
    const want = Math.min(len >>> 0, LIMITS.readBytes);
    const buf = Buffer.allocUnsafe(want);
    const { bytesRead } = await fh.read(buf, 0, want, offset);
    if (bytesRead === 0) return this.sftp.status(id, STATUS.EOF, 'End of file');
    this.sftp.data(id, bytesRead === want ? buf : buf.subarray(0, bytesRead));
  }

  private async write(id: number, handle: Buffer, offset: number, data: Buffer): Promise<void> {
    const { fh } = this.opened(handle, 'file');
    if (!validOffset(offset) || !Number.isSafeInteger(offset + data.length)) throw new Refusal(STATUS.FAILURE, 'Offset out of range');
    for (let done = 0; done < data.length; ) {
      const { bytesWritten } = await fh.write(data, done, data.length - done, offset + done);
      done += bytesWritten;
    }
    this.ok(id);
  }

  private async stat(id: number, path: string, how: (p: string) => Promise<Stats>): Promise<void> {
    this.sftp.attrs(id, attrsOf(await how(this.path(path))));
  }

  private async fstat(id: number, handle: Buffer): Promise<void> {
    this.sftp.attrs(id, attrsOf(await this.opened(handle, 'file').fh.stat()));
  }

  private async setstat(id: number, path: string, attrs: RequestAttrs): Promise<void> {
    const p = this.path(path);
    await applyAttrs(attrs, {
      truncate: (size) => truncate(p, size),
      chmod: (mode) => chmod(p, mode),
      utimes: (a, m) => utimes(p, a, m),
      chown: (uid, gid) => chown(p, uid, gid),
    });
    this.ok(id);
  }

  private async fsetstat(id: number, handle: Buffer, attrs: RequestAttrs): Promise<void> {
    const { fh } = this.opened(handle, 'file');
    await applyAttrs(attrs, {
      truncate: (size) => fh.truncate(size),
      chmod: (mode) => fh.chmod(mode),
      utimes: (a, m) => fh.utimes(a, m),
      chown: (uid, gid) => fh.chown(uid, gid),
    });
    this.ok(id);
  }

  private async opendir(id: number, path: string): Promise<void> {
    const p = this.path(path);
    if (this.handles.size >= LIMITS.handles) throw new Refusal(STATUS.FAILURE, `Too many open handles (at most ${LIMITS.handles})`);
    const dir = await opendir(p);
    if (!this.giveHandle(id, { kind: 'dir', dir, path: p })) await dir.close();
  }

  private async readdir(id: number, handle: Buffer): Promise<void> {
    const o = this.opened(handle, 'dir');
    const names: string[] = [];
    while (names.length < LIMITS.readdirEntries) {
      const entry = await o.dir.read();
      if (!entry) break;
      names.push(entry.name);
    }
    if (names.length === 0) return this.sftp.status(id, STATUS.EOF, 'End of file');
    const nowS = Math.floor(Date.now() / 1000);
    const entries = await Promise.all(
      names.map(async (filename) => {
        const st = await lstat(`${o.path}/${filename}`).catch(() => undefined);
        // An entry removed since it was listed is still listed, without attributes (as sftp-server does).
        if (!st) return { filename, longname: filename, attrs: {} };
        return { filename, longname: longname(filename, st, this.idNames.users, this.idNames.groups, nowS), attrs: attrsOf(st) };
      }),
    );
    this.nameReply(id, entries);
  }

  private async pathOp(id: number, path: string, op: (p: string) => Promise<void>): Promise<void> {
    await op(this.path(path));
    this.ok(id);
  }

  private async mkdir(id: number, path: string, attrs: RequestAttrs): Promise<void> {
    const mode = typeof attrs?.mode === 'number' ? attrs.mode & 0o7777 : 0o777;
    await mkdir(this.path(path), { mode });
    this.ok(id);
  }

  /** The canonical absolute path; like OpenSSH's, its last component need not exist (a file about to be written). */
  private async realpath(id: number, path: string): Promise<void> {
    const p = this.path(path);
    let resolved: string;
    try {
      resolved = await realpath(p);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || dirname(p) === p) throw err;
      resolved = resolve(await realpath(dirname(p)), basename(p));
    }
    this.nameReply(id, [{ filename: resolved, longname: resolved, attrs: {} }]);
  }

  /** SFTP v3 RENAME does not replace an existing file (OpenSSH's posix-rename extension would; not offered). */
  private async rename(id: number, from: string, to: string): Promise<void> {
    const [a, b] = [this.path(from), this.path(to)];
    const exists = await lstat(b).then(
      () => true,
      () => false,
    );
    if (exists) throw new Refusal(STATUS.FAILURE, 'File exists');
    await rename(a, b);
    this.ok(id);
  }

  private async readlink(id: number, path: string): Promise<void> {
    const target = await readlink(this.path(path));
    this.nameReply(id, [{ filename: target, longname: target, attrs: {} }]);
  }

  /** The target is stored as given (a relative target is relative to the link's directory, not to home). */
  private async symlink(id: number, linkPath: string, targetPath: string): Promise<void> {
    if (typeof targetPath !== 'string' || targetPath.includes('\0') || Buffer.byteLength(targetPath) > LIMITS.pathBytes) throw new Refusal(STATUS.BAD_MESSAGE, 'Bad path');
    await symlink(targetPath, this.path(linkPath));
    this.ok(id);
  }
}

interface AttrOps {
  truncate(size: number): Promise<void>;
  chmod(mode: number): Promise<void>;
  utimes(atime: number, mtime: number): Promise<void>;
  chown(uid: number, gid: number): Promise<void>;
}

/** In OpenSSH's order: size, permissions, times, owner. */
async function applyAttrs(attrs: RequestAttrs, ops: AttrOps): Promise<void> {
  const c = attrChanges(attrs ?? {});
  if (!c.ok) throw new Refusal(STATUS.FAILURE, c.message);
  if (c.size !== undefined) await ops.truncate(c.size);
  if (c.mode !== undefined) await ops.chmod(c.mode);
  if (c.times) await ops.utimes(c.times.atime, c.times.mtime);
  if (c.owner) await ops.chown(c.owner.uid, c.owner.gid);
}
