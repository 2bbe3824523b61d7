/**
 * The pure parts of the built-in sftp-server: errno → status, open flags, attributes, paths, `ls -l` lines and
 * the handle table.
 */
import { constants as fsConstants } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { HandleTable } from '../../src/agent/sftp/handles.js';
import { LIMITS, OPEN_MODE, STATUS, attrChanges, longname, modeString, namesById, openFlags, resolvePath, statusForError, validOffset } from '../../src/agent/sftp/posix.js';

const errno = (code: string, n: number) => Object.assign(new Error(`${code}: something, open '/x'`), { code, errno: n });

describe('statusForError', () => {
  it('maps ENOENT to NO_SUCH_FILE, EACCES and EPERM to PERMISSION_DENIED, anything else to FAILURE with its text', () => {
    expect(statusForError(errno('ENOENT', -2))).toEqual({ code: STATUS.NO_SUCH_FILE, message: 'No such file' });
    expect(statusForError(errno('ENOTDIR', -20)).code).toBe(STATUS.NO_SUCH_FILE);
    expect(statusForError(errno('EACCES', -13))).toEqual({ code: STATUS.PERMISSION_DENIED, message: 'Permission denied' });
    expect(statusForError(errno('EPERM', -1)).code).toBe(STATUS.PERMISSION_DENIED);
    expect(statusForError(errno('EEXIST', -17))).toEqual({ code: STATUS.FAILURE, message: 'File already exists' });
    expect(statusForError(errno('ENOTEMPTY', -39))).toEqual({ code: STATUS.FAILURE, message: 'Directory not empty' });
    // Never the path or the code's internals: only what the client may print.
    expect(statusForError(new Error('boom'))).toEqual({ code: STATUS.FAILURE, message: 'Boom' });
    expect(statusForError(undefined)).toEqual({ code: STATUS.FAILURE, message: 'Failure' });
  });
});

describe('openFlags', () => {
  it('turns SFTP pflags into open(2) flags', () => {
    const { O_RDONLY, O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_EXCL, O_APPEND } = fsConstants;
    expect(openFlags(OPEN_MODE.READ)).toBe(O_RDONLY);
    expect(openFlags(0)).toBe(O_RDONLY);
    expect(openFlags(OPEN_MODE.WRITE | OPEN_MODE.CREAT | OPEN_MODE.TRUNC)).toBe(O_WRONLY | O_CREAT | O_TRUNC);
    expect(openFlags(OPEN_MODE.READ | OPEN_MODE.WRITE | OPEN_MODE.APPEND)).toBe(O_RDWR | O_APPEND);
    expect(openFlags(OPEN_MODE.WRITE | OPEN_MODE.CREAT | OPEN_MODE.EXCL)).toBe(O_WRONLY | O_CREAT | O_EXCL);
    // Bits SFTP v3 does not define are ignored.
    expect(openFlags(0xffffff00 | OPEN_MODE.READ)).toBe(O_RDONLY);
  });
});

describe('attrChanges', () => {
  it('keeps what the client sent, permission bits only', () => {
    expect(attrChanges({})).toEqual({ ok: true });
    expect(attrChanges({ size: 10, mode: 0o100644 | 0o4000, atime: 1, mtime: 2, uid: 3, gid: 4 })).toEqual({
      ok: true,
      size: 10,
      mode: 0o4644,
      times: { atime: 1, mtime: 2 },
      owner: { uid: 3, gid: 4 },
    });
  });

  it('refuses values no file can have', () => {
    expect(attrChanges({ size: 2 ** 60 })).toMatchObject({ ok: false });
    expect(attrChanges({ size: -1 })).toMatchObject({ ok: false });
    expect(attrChanges({ atime: 1 })).toMatchObject({ ok: false });
    expect(attrChanges({ uid: 1.5, gid: 2 })).toMatchObject({ ok: false });
  });
});

describe('resolvePath', () => {
  it('is relative to home, absolute paths as given (not normalised: the kernel follows links)', () => {
    expect(resolvePath('/home/alice', '')).toBe('/home/alice');
    expect(resolvePath('/home/alice', '.')).toBe('/home/alice/.');
    expect(resolvePath('/home/alice', 'a/b')).toBe('/home/alice/a/b');
    expect(resolvePath('/', 'a')).toBe('/a');
    expect(resolvePath('/home/alice', '/etc/../tmp')).toBe('/etc/../tmp');
  });

  it('refuses a NUL byte and paths longer than PATH_MAX', () => {
    expect(resolvePath('/home/alice', 'a\0b')).toBeUndefined();
    expect(resolvePath('/home/alice', 'a'.repeat(LIMITS.pathBytes + 1))).toBeUndefined();
    expect(resolvePath('/home/alice', 'a'.repeat(LIMITS.pathBytes))).toBeDefined();
  });
});

describe('validOffset', () => {
  it('accepts exact non-negative integers only', () => {
    expect(validOffset(0)).toBe(true);
    expect(validOffset(2 ** 53 - 1)).toBe(true);
    expect(validOffset(2 ** 63)).toBe(false);
    expect(validOffset(-1)).toBe(false);
    expect(validOffset(undefined)).toBe(false);
  });
});

describe('ls -l lines', () => {
  it('modeString shows type, permissions and the setuid, setgid and sticky bits', () => {
    expect(modeString(0o100644)).toBe('-rw-r--r--');
    expect(modeString(0o040755)).toBe('drwxr-xr-x');
    expect(modeString(0o120777)).toBe('lrwxrwxrwx');
    expect(modeString(0o104755)).toBe('-rwsr-xr-x');
    expect(modeString(0o102644)).toBe('-rw-r-Sr--');
    expect(modeString(0o041777)).toBe('drwxrwxrwt');
    expect(modeString(0o010600)).toBe('prw-------');
  });

  it('longname: names for known ids, numbers for others; the year for old files', () => {
    const users = namesById('root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n\nbroken\n');
    const groups = namesById('root:x:0:\nstaff:x:50:\n');
    expect([...users]).toEqual([[0, 'root'], [1000, 'alice']]);
    const now = Date.UTC(2024, 5, 15, 12, 0) / 1000;
    const recent = new Date(2024, 5, 1, 9, 5).getTime();
    const st = { mode: 0o100640, nlink: 1, uid: 1000, gid: 50, size: 1234, mtimeMs: recent };
    expect(longname('notes.txt', st, users, groups, now)).toBe('-rw-r-----   1 alice    staff        1234 Jun  1 09:05 notes.txt');
    const old = { ...st, uid: 4242, gid: 4343, mtimeMs: new Date(2020, 0, 2).getTime() };
    expect(longname('old', old, users, groups, now)).toBe('-rw-r-----   1 4242     4343         1234 Jan  2  2020 old');
  });
});

describe('HandleTable', () => {
  it('gives 4-byte handles, finds and forgets them, and refuses more than its maximum', () => {
    const t = new HandleTable<string>(2);
    const a = t.add('a')!;
    const b = t.add('b')!;
    expect(a).toHaveLength(4);
    expect(a.equals(b)).toBe(false);
    expect(t.add('c')).toBeUndefined();
    expect(t.get(a)).toBe('a');
    expect(t.take(a)).toBe('a');
    expect(t.get(a)).toBeUndefined();
    expect(t.size).toBe(1);
    const c = t.add('c')!;
    expect(c.equals(a)).toBe(false); // not reused at once: a stale handle names nothing
    expect(t.takeAll().sort()).toEqual(['b', 'c']);
    expect(t.size).toBe(0);
  });

  it('names nothing with a handle of another length', () => {
    const t = new HandleTable<string>(1);
    t.add('a');
    expect(t.get(Buffer.alloc(3))).toBeUndefined();
    expect(t.get(Buffer.alloc(5))).toBeUndefined();
    expect(t.take(Buffer.alloc(0))).toBeUndefined();
  });
});
