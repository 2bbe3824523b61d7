/**
 * A raw SFTP v3 client on the standard input and output of `gateway sftp-server`, for tests that need exact
 * status codes or bytes no real client sends. Packets are built by hand (draft-ietf-secsh-filexfer-02).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { gatewayForAnyUser } from './asuser.js';
import { BIN } from './gateway.js';

export const FXP = {
  INIT: 1,
  OPEN: 3,
  CLOSE: 4,
  READ: 5,
  WRITE: 6,
  LSTAT: 7,
  FSTAT: 8,
  SETSTAT: 9,
  FSETSTAT: 10,
  OPENDIR: 11,
  READDIR: 12,
  REMOVE: 13,
  MKDIR: 14,
  RMDIR: 15,
  REALPATH: 16,
  STAT: 17,
  RENAME: 18,
  READLINK: 19,
  SYMLINK: 20,
  EXTENDED: 200,
  VERSION: 2,
  STATUS: 101,
  HANDLE: 102,
  DATA: 103,
  NAME: 104,
  ATTRS: 105,
} as const;

export const FX = { OK: 0, EOF: 1, NO_SUCH_FILE: 2, PERMISSION_DENIED: 3, FAILURE: 4, BAD_MESSAGE: 5, OP_UNSUPPORTED: 8 } as const;
export const PFLAG = { READ: 1, WRITE: 2, APPEND: 4, CREAT: 8, TRUNC: 16, EXCL: 32 } as const;

export const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
};
export const u64 = (n: bigint) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(n);
  return b;
};
export const str = (s: string | Buffer) => {
  const bytes = typeof s === 'string' ? Buffer.from(s) : s;
  return Buffer.concat([u32(bytes.length), bytes]);
};
/** ATTRS with no field set. */
export const NO_ATTRS = u32(0);

/** One framed packet: uint32 length, type, the fields. */
export const packet = (type: number, ...fields: Buffer[]) => {
  const body = Buffer.concat([Buffer.from([type]), ...fields]);
  return Buffer.concat([u32(body.length), body]);
};

export interface Reply {
  type: number;
  id: number;
  body: Buffer;
}

/** The parts of a reply the tests look at. */
export const status = (r: Reply) => ({ code: r.body.readUInt32BE(0), message: r.body.subarray(8, 8 + r.body.readUInt32BE(4)).toString() });
export const bytesOf = (r: Reply) => r.body.subarray(4, 4 + r.body.readUInt32BE(0));
export const firstName = (r: Reply) => r.body.subarray(8, 8 + r.body.readUInt32BE(4)).toString();

export interface RawServer {
  child: ChildProcess;
  /** Sends a request with the next id; resolves with its reply. */
  request(type: number, ...fields: Buffer[]): Promise<Reply>;
  /** Sends bytes as they are. */
  send(bytes: Buffer): void;
  /** Exit code (or signal) and standard error, once the process has exited. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>;
  stderr(): string;
}

/** `gateway sftp-server` with HOME=home, as root or (asNobody) as the user nobody; after INIT with `init`. */
export async function startRawServer(home: string, options: { asNobody?: boolean; init?: boolean } = {}): Promise<RawServer> {
  // As nobody, from a copy of the build that nobody can read (the checkout may be under /root, mode 0700).
  const node = [process.execPath, options.asNobody ? gatewayForAnyUser() : BIN('gateway'), 'sftp-server'];
  const argv = options.asNobody ? ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '--', ...node] : node;
  const child = spawn(argv[0]!, argv.slice(1), { env: { PATH: process.env.PATH ?? '', HOME: home }, stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  child.stdin!.on('error', () => undefined); // it may exit before reading everything
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>((resolve) =>
    child.once('close', (code, signal) => resolve({ code, signal, stderr })),
  );
  let buf = Buffer.alloc(0);
  const waiting = new Map<number, (r: Reply) => void>();
  const versions: Array<(r: Reply) => void> = [];
  child.stdout!.on('data', (c: Buffer) => {
    buf = Buffer.concat([buf, c]);
    while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
      const len = buf.readUInt32BE(0);
      const type = buf[4]!;
      const id = type === FXP.VERSION ? -1 : buf.readUInt32BE(5);
      const reply = { type, id, body: Buffer.from(buf.subarray(type === FXP.VERSION ? 5 : 9, 4 + len)) };
      buf = buf.subarray(4 + len);
      if (type === FXP.VERSION) versions.shift()?.(reply);
      else waiting.get(id)?.(reply);
      waiting.delete(id);
    }
  });
  let nextId = 1;
  const gone = exited.then(({ code, signal }) => {
    throw new Error(`sftp-server exited (${code ?? signal}) before answering:\n${stderr}`);
  });
  gone.catch(() => undefined);
  const server: RawServer = {
    child,
    send: (bytes) => child.stdin!.write(bytes),
    request: (type, ...fields) => {
      const id = nextId++;
      const reply = new Promise<Reply>((resolve) => waiting.set(id, resolve));
      child.stdin!.write(packet(type, u32(id), ...fields));
      return Promise.race([reply, gone]);
    },
    exited,
    stderr: () => stderr,
  };
  if (options.init !== false) {
    const version = new Promise<Reply>((resolve) => versions.push(resolve));
    server.send(packet(FXP.INIT, u32(3)));
    const v = await Promise.race([version, gone]);
    if (v.body.readUInt32BE(0) !== 3) throw new Error(`sftp-server answered version ${v.body.readUInt32BE(0)}`);
  }
  return server;
}
