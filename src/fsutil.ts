/**
 * Files the gateway keeps: keys, certificates, identities, profiles, the upgraders' repository entries and
 * schedules. writeFileAtomic is the one way a file is replaced: a temp file in the same directory (O_EXCL),
 * fchmod to the mode asked for (whatever the umask), write, fsync, rename over the path, fsync of the directory.
 * A crash leaves either the old or the new content, never half a key; a failure leaves the old content and no
 * temp file. Private keys and anything else secret are written only through writeSecretFile (mode 0600,
 * directory 0700). Synchronous on purpose: these are small files written at start-up, join, login and upgrade.
 *
 * Errors are GW_ERR_FS_WRITE / GW_ERR_FS_READ naming the path (writeFileAtomic itself throws the fs error, for
 * callers that name the file in their own error); the data never appears in a message.
 */
import {
  closeSync,
  fchmodSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import { GatewayError } from './errors.js';

export const SECRET_FILE_MODE = 0o600;
export const SECRET_DIR_MODE = 0o700;
export const PUBLIC_FILE_MODE = 0o644;
export const PUBLIC_DIR_MODE = 0o755;

function errCode(err: unknown): string {
  return (err as NodeJS.ErrnoException | undefined)?.code ?? 'error';
}

function writeError(path: string, err: unknown): GatewayError {
  return new GatewayError('GW_ERR_FS_WRITE', `cannot write ${path} (${errCode(err)})`, { cause: err, details: { path } });
}

/** Best effort: makes the rename itself durable. Some filesystems refuse fsync on a directory; that is fine. */
function syncDir(dir: string): void {
  let fd: number | undefined;
  try {
    fd = openSync(dir, 'r');
    fsyncSync(fd);
  } catch {
    // not supported here
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/**
 * Replaces path with data atomically (see the file comment), creating missing parent directories with dirMode.
 * On failure the path keeps its old content, the temp file is removed, and the fs error is thrown as it came.
 */
export function writeFileAtomic(path: string, data: string | Uint8Array, options: { mode: number; dirMode: number }): void {
  const { mode: fileMode, dirMode } = options;
  const dir = dirname(path);
  mkdirSync(dir, { recursive: true, mode: dirMode });
  const tmp = join(dir, `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
  let fd: number | undefined;
  try {
    fd = openSync(tmp, 'wx', fileMode); // O_CREAT | O_EXCL: never follows or reuses an existing file
    fchmodSync(fd, fileMode); // the umask may have removed bits from a public file's mode
    writeFileSync(fd, data);
    fsyncSync(fd);
    closeSync(fd);
    fd = undefined;
    renameSync(tmp, path);
  } catch (err) {
    if (fd !== undefined) {
      try {
        closeSync(fd);
      } catch {
        // already failing
      }
    }
    try {
      unlinkSync(tmp);
    } catch {
      // never created, or already renamed
    }
    throw err;
  }
  syncDir(dir);
}

function writeAtomic(path: string, data: string | Uint8Array, mode: number, dirMode: number): void {
  try {
    writeFileAtomic(path, data, { mode, dirMode });
  } catch (err) {
    throw writeError(path, err);
  }
}

/** Writes a secret (private key, token, credentials): mode 0600, parent directories created 0700. Atomic. */
export function writeSecretFile(path: string, data: string | Uint8Array): void {
  writeAtomic(path, data, SECRET_FILE_MODE, SECRET_DIR_MODE);
}

/** Writes a non-secret file (certificate, CA, address): mode 0644 unless given, parent directories 0755. Atomic. */
export function writePublicFile(path: string, data: string | Uint8Array, mode: number = PUBLIC_FILE_MODE): void {
  writeAtomic(path, data, mode, PUBLIC_DIR_MODE);
}

/**
 * Makes sure path exists as a file only its owner can read (mode 0600, whatever the umask; an existing file is
 * tightened), for files other code appends to, such as the log file. Parent directories are created 0700.
 */
export function ensurePrivateFile(path: string): void {
  try {
    mkdirSync(dirname(path), { recursive: true, mode: SECRET_DIR_MODE });
    const fd = openSync(path, 'a', SECRET_FILE_MODE);
    try {
      fchmodSync(fd, SECRET_FILE_MODE);
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    throw new GatewayError('GW_ERR_FS_WRITE', `cannot create ${path} (${errCode(err)})`, { cause: err, details: { path } });
  }
}

/** The file's content as UTF-8 text, or undefined when it does not exist. Other failures: GW_ERR_FS_READ. */
export function readIfExists(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    if (errCode(err) === 'ENOENT') return undefined;
    throw new GatewayError('GW_ERR_FS_READ', `cannot read ${path} (${errCode(err)})`, { cause: err, details: { path } });
  }
}
