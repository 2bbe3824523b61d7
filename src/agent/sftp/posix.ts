/**
 * Pure mappings between POSIX file facts and SFTP version 3, for the built-in sftp-server (server.ts): errors to
 * status codes, open flags, stat results to attributes, the `ls -l` line of a directory listing, paths relative
 * to the home directory, and the limits that keep one session's memory bounded. No I/O here.
 */
import { constants as fsConstants, type Stats } from 'node:fs';
import { isAbsolute } from 'node:path';
import { getSystemErrorMap } from 'node:util';
import ssh2 from 'ssh2';

export const STATUS = ssh2.utils.sftp.STATUS_CODE;
export const OPEN_MODE = ssh2.utils.sftp.OPEN_MODE;

/** Bounds of one session (OpenSSH's sftp-server uses the same message and read sizes). */
export const LIMITS = {
  /** Open file and directory handles at once. */
  handles: 256,
  /** Bytes one READ answers at most: a DATA reply must fit OpenSSH's 256 KiB message limit. */
  readBytes: 256 * 1024 - 1024,
  /** Entries one READDIR answers at most. */
  readdirEntries: 100,
  /** Bytes of a path (Linux PATH_MAX). */
  pathBytes: 4096,
  /** Requests parsed and waiting; beyond this the server stops reading its input until they are answered. */
  queuedRequests: 64,
} as const;

export interface Status {
  code: number;
  message: string;
}

/** An SFTP status for a failed file operation: errno → code, as OpenSSH's sftp-server maps them. */
export function statusForError(err: unknown): Status {
  const e = err as NodeJS.ErrnoException;
  switch (e?.code) {
    case 'ENOENT':
    case 'ENOTDIR':
    case 'ELOOP':
      return { code: STATUS.NO_SUCH_FILE, message: 'No such file' };
    case 'EACCES':
    case 'EPERM':
      return { code: STATUS.PERMISSION_DENIED, message: 'Permission denied' };
    default: {
      const described = typeof e?.errno === 'number' ? getSystemErrorMap().get(e.errno)?.[1] : undefined;
      const text = described ?? (typeof e?.code === 'string' ? e.code : e instanceof Error ? e.message : 'Failure');
      return { code: STATUS.FAILURE, message: text.charAt(0).toUpperCase() + text.slice(1) };
    }
  }
}

/** SFTP open flags (pflags) → open(2) flags; SSH_FXF_READ | SSH_FXF_WRITE decide the access mode. */
export function openFlags(pflags: number): number {
  const read = (pflags & OPEN_MODE.READ) !== 0;
  const write = (pflags & OPEN_MODE.WRITE) !== 0;
  let flags = read && write ? fsConstants.O_RDWR : write ? fsConstants.O_WRONLY : fsConstants.O_RDONLY;
  if (pflags & OPEN_MODE.APPEND) flags |= fsConstants.O_APPEND;
  if (pflags & OPEN_MODE.CREAT) flags |= fsConstants.O_CREAT;
  if (pflags & OPEN_MODE.TRUNC) flags |= fsConstants.O_TRUNC;
  if (pflags & OPEN_MODE.EXCL) flags |= fsConstants.O_EXCL;
  return flags;
}

/** Attributes as a request carries them: each field only when the client sent it. */
export interface RequestAttrs {
  size?: number | undefined;
  uid?: number | undefined;
  gid?: number | undefined;
  mode?: number | undefined;
  atime?: number | undefined;
  mtime?: number | undefined;
}

/** Attributes for a reply. */
export interface ReplyAttrs {
  size: number;
  uid: number;
  gid: number;
  mode: number;
  atime: number;
  mtime: number;
}

export function attrsOf(st: Stats): ReplyAttrs {
  return { size: st.size, uid: st.uid, gid: st.gid, mode: st.mode, atime: Math.floor(st.atimeMs / 1000), mtime: Math.floor(st.mtimeMs / 1000) };
}

/** The changes a SETSTAT asks for, checked: what to apply, or why the request is refused. */
export type AttrChanges =
  | { ok: true; size?: number; mode?: number; times?: { atime: number; mtime: number }; owner?: { uid: number; gid: number } }
  | { ok: false; message: string };

const isU32 = (n: unknown): n is number => typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= 0xffffffff;

export function attrChanges(a: RequestAttrs): AttrChanges {
  const out: AttrChanges = { ok: true };
  if (a.size !== undefined) {
    if (!Number.isSafeInteger(a.size) || a.size < 0) return { ok: false, message: 'Size out of range' };
    out.size = a.size;
  }
  if (a.mode !== undefined) {
    if (!isU32(a.mode)) return { ok: false, message: 'Bad permissions' };
    out.mode = a.mode & 0o7777;
  }
  if (a.atime !== undefined || a.mtime !== undefined) {
    if (!isU32(a.atime) || !isU32(a.mtime)) return { ok: false, message: 'Bad times' };
    out.times = { atime: a.atime, mtime: a.mtime };
  }
  if (a.uid !== undefined || a.gid !== undefined) {
    if (!isU32(a.uid) || !isU32(a.gid)) return { ok: false, message: 'Bad owner' };
    out.owner = { uid: a.uid, gid: a.gid };
  }
  return out;
}

/**
 * A path from a request as the file system path it names: relative paths are relative to the user's home
 * directory (where sshd starts sftp-server). undefined for a path no file can have (NUL, longer than PATH_MAX).
 */
export function resolvePath(home: string, path: string): string | undefined {
  if (path.includes('\0') || Buffer.byteLength(path) > LIMITS.pathBytes) return undefined;
  if (path === '') return home;
  // Not normalised: "link/.." must mean what the kernel makes of it (the parent of the link's target).
  if (isAbsolute(path)) return path;
  return home.endsWith('/') ? `${home}${path}` : `${home}/${path}`;
}

/** A byte offset from a request: ssh2 decodes the uint64 as a number, exact only up to 2^53. */
export function validOffset(offset: unknown): offset is number {
  return typeof offset === 'number' && Number.isSafeInteger(offset) && offset >= 0;
}

/** /etc/passwd or /etc/group text → id → name. */
export function namesById(text: string): Map<number, string> {
  const names = new Map<number, string>();
  for (const line of text.split('\n')) {
    const f = line.split(':');
    const id = Number(f[2]);
    if (f.length >= 3 && f[0] && f[2] !== '' && Number.isInteger(id) && !names.has(id)) names.set(id, f[0]);
  }
  return names;
}

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const SIX_MONTHS_S = 182 * 24 * 3600;

function typeChar(mode: number): string {
  switch (mode & fsConstants.S_IFMT) {
    case fsConstants.S_IFDIR:
      return 'd';
    case fsConstants.S_IFLNK:
      return 'l';
    case fsConstants.S_IFCHR:
      return 'c';
    case fsConstants.S_IFBLK:
      return 'b';
    case fsConstants.S_IFIFO:
      return 'p';
    case fsConstants.S_IFSOCK:
      return 's';
    default:
      return '-';
  }
}

/** `drwxr-x---` for a mode, with setuid/setgid/sticky as ls(1) shows them. */
export function modeString(mode: number): string {
  const bit = (mask: number, c: string) => (mode & mask ? c : '-');
  const special = (x: number, s: number, on: string) => (mode & s ? (mode & x ? on : on.toUpperCase()) : mode & x ? 'x' : '-');
  return (
    typeChar(mode) +
    bit(0o400, 'r') + bit(0o200, 'w') + special(0o100, 0o4000, 's') +
    bit(0o040, 'r') + bit(0o020, 'w') + special(0o010, 0o2000, 's') +
    bit(0o004, 'r') + bit(0o002, 'w') + special(0o001, 0o1000, 't')
  );
}

/** The `ls -l` line OpenSSH's sftp-server sends with each directory entry (sftp's `ls -l` prints it). */
export function longname(name: string, st: Pick<Stats, 'mode' | 'nlink' | 'uid' | 'gid' | 'size' | 'mtimeMs'>, users: Map<number, string>, groups: Map<number, string>, nowS: number): string {
  const user = users.get(st.uid) ?? String(st.uid);
  const group = groups.get(st.gid) ?? String(st.gid);
  const mtimeS = Math.floor(st.mtimeMs / 1000);
  const d = new Date(mtimeS * 1000);
  const recent = mtimeS <= nowS + 3600 && nowS - mtimeS < SIX_MONTHS_S;
  const day = `${MONTHS[d.getMonth()]} ${String(d.getDate()).padStart(2)}`;
  const when = recent ? `${day} ${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}` : `${day}  ${d.getFullYear()}`;
  return `${modeString(st.mode)} ${String(st.nlink).padStart(3)} ${user.padEnd(8)} ${group.padEnd(8)} ${String(st.size).padStart(8)} ${when} ${name}`;
}
