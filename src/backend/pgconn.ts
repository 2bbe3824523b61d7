/**
 * The PostgreSQL backend's connection string, read by us rather than by the driver: it decides TLS from a few
 * well-known libpq parameters and the configuration's files, and refuses what it does not understand instead of
 * passing it on silently. Pure: no I/O (the TLS files are read by postgres.ts).
 *
 *   postgresql://[user[:password]@]host[:port]/database[?param=value&...]
 *   postgresql://[user@]/database?host=/run/postgresql          (a unix socket directory)
 *
 * Parameters: sslmode (disable | require | verify-ca | verify-full), host (a socket directory, absolute),
 * application_name, connect_timeout (seconds). User name, password and database are percent-decoded.
 */
import { isIP } from 'node:net';
import type { ConnectionOptions } from 'node:tls';
import { redactUrl } from '../redact.js';

export const SSL_MODES = ['disable', 'require', 'verify-ca', 'verify-full'] as const;
export type SslMode = (typeof SSL_MODES)[number];

const PARAMETERS = ['sslmode', 'host', 'application_name', 'connect_timeout'];

export interface PgConnSpec {
  /** A host name or IP address (without brackets), or an absolute socket directory. */
  host: string;
  port: number;
  /** Undefined: the driver's default (PGUSER, else the user running the gateway). */
  user: string | undefined;
  /** Undefined: PGPASSWORD or ~/.pgpass, or none (client certificates). */
  password: string | undefined;
  database: string;
  /** Undefined when the string does not say: decided with the TLS files (tlsMode). */
  sslmode: SslMode | undefined;
  applicationName: string | undefined;
  connectTimeoutMs: number | undefined;
  /** The string with its password as "***": the one form errors and logs show. */
  display: string;
  /** host:port, or the socket path: what errors name as the server. */
  address: string;
}

/** Why a connection string is refused; message and hint never hold the password. */
export class ConnStringError extends Error {
  constructor(
    message: string,
    readonly hint: string,
  ) {
    super(message);
  }
}

const FORM = 'postgresql://user@host:5432/database?sslmode=verify-full';
const EMPTY_HOST = 'no-host.invalid';

function decode(part: string, what: string, display: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new ConnStringError(`the ${what} in ${display} is not valid percent-encoding`, 'Write a "%" in a user name, password or database name as %25.');
  }
}

function parseParameters(url: URL, display: string): Map<string, string> {
  const params = new Map<string, string>();
  for (const [name, value] of url.searchParams) {
    if (!PARAMETERS.includes(name)) {
      throw new ConnStringError(
        `the connection string ${display} has the parameter ${JSON.stringify(name)}, which the gateway does not support`,
        `Supported parameters: ${PARAMETERS.join(', ')}. Certificates go in gateway.storage.ca_file, cert_file and key_file.`,
      );
    }
    if (params.has(name)) throw new ConnStringError(`the connection string ${display} sets ${name} twice`, 'Set each parameter once.');
    params.set(name, value);
  }
  return params;
}

function sslModeOf(raw: string | undefined, display: string): SslMode | undefined {
  if (raw === undefined) return undefined;
  if ((SSL_MODES as readonly string[]).includes(raw)) return raw as SslMode;
  const hint =
    raw === 'prefer' || raw === 'allow'
      ? `sslmode=${raw} falls back to plain text when TLS fails, which the gateway does not do: use require or verify-full, or disable.`
      : `Use one of ${SSL_MODES.join(', ')}.`;
  throw new ConnStringError(`the connection string ${display} has sslmode=${raw}`, hint);
}

function timeoutOf(raw: string | undefined, display: string): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!/^\d+$/.test(raw) || n < 1 || n > 3600) {
    throw new ConnStringError(`the connection string ${display} has connect_timeout=${raw}`, 'connect_timeout is a whole number of seconds from 1 to 3600.');
  }
  return n * 1000;
}

/** Where to connect: the URL's host, or the host parameter (a socket directory); not both. */
function hostOf(hostname: string, socketDir: string | undefined, display: string): { host: string; socket: boolean } {
  const urlHost = hostname.startsWith('[') ? hostname.slice(1, -1) : hostname;
  if (socketDir !== undefined) {
    if (!socketDir.startsWith('/')) {
      throw new ConnStringError(`the connection string ${display} has host=${socketDir}`, 'The host parameter names a unix socket directory: an absolute path such as /run/postgresql.');
    }
    if (urlHost !== '') throw new ConnStringError(`the connection string ${display} names a host twice (in the address and as host=)`, 'Keep one of them.');
    return { host: socketDir, socket: true };
  }
  if (urlHost === '') throw new ConnStringError(`the connection string ${display} names no host`, `Write it as ${FORM}.`);
  if (urlHost.includes(',')) throw new ConnStringError(`the connection string ${display} names several hosts`, 'Name one host (a load balancer or a virtual IP in front of a PostgreSQL cluster).');
  return { host: decode(urlHost, 'host', display), socket: false };
}

/** Parses and checks a connection string; throws ConnStringError. */
export function parsePgConnString(text: string): PgConnSpec {
  if (typeof text !== 'string') throw new ConnStringError(`expected a postgresql:// connection string, got ${typeof text}`, `Write it as ${FORM}.`);
  if (!/^postgres(?:ql)?:\/\//i.test(text)) {
    // Not shown: a libpq "host=... password=..." string would put its password in the message.
    throw new ConnStringError('expected a postgresql:// connection string (keyword=value strings are not supported)', `Write it as ${FORM}.`);
  }
  const display = redactUrl(text);
  let url: URL;
  let emptyHost = false;
  try {
    // The WHATWG parser refuses a user name without a host (postgresql://gw@/db?host=/run/postgresql), which
    // libpq allows for sockets: such a string is parsed with a stand-in host that is never used.
    const m = /^([a-z]+:\/\/)([^/?#]*)(.*)$/is.exec(text)!;
    const hostPart = m[2]!.slice(m[2]!.lastIndexOf('@') + 1);
    emptyHost = hostPart === '' || hostPart.startsWith(':');
    url = new URL(emptyHost ? `${m[1]}${m[2]!.slice(0, m[2]!.length - hostPart.length)}${EMPTY_HOST}${hostPart}${m[3]}` : text);
  } catch {
    throw new ConnStringError(`the connection string ${display} is not a valid URL`, `Write it as ${FORM}; percent-encode special characters in the password.`);
  }
  if (url.hash !== '') throw new ConnStringError(`the connection string ${display} has a #fragment`, `Write it as ${FORM}.`);
  const params = parseParameters(url, display);
  const { host, socket } = hostOf(emptyHost ? '' : url.hostname, params.get('host'), display);
  const port = url.port === '' ? 5432 : Number(url.port);
  const database = decode(url.pathname.replace(/^\//, ''), 'database name', display);
  if (database === '' || database.includes('/')) {
    throw new ConnStringError(`the connection string ${display} names no database`, `Name the database after the address: ${FORM}.`);
  }
  const sslmode = sslModeOf(params.get('sslmode'), display);
  if (socket && sslmode !== undefined && sslmode !== 'disable') {
    throw new ConnStringError(`the connection string ${display} asks for TLS over a unix socket`, 'A unix socket is local and carries no TLS: drop sslmode, or connect over TCP.');
  }
  const user = url.username === '' ? undefined : decode(url.username, 'user name', display);
  const password = url.password === '' ? undefined : decode(url.password, 'password', display);
  const address = socket ? `${host}/.s.PGSQL.${port}` : isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
  return {
    host,
    port,
    user,
    password,
    database,
    sslmode,
    applicationName: params.get('application_name'),
    connectTimeoutMs: timeoutOf(params.get('connect_timeout'), display),
    display,
    address,
  };
}

export interface PgTlsFiles {
  ca?: string;
  cert?: string;
  key?: string;
}

/**
 * The sslmode in force: the string's, else verify-full when a CA or a client certificate is configured (files
 * for TLS mean TLS, checked), else disable. A CA with sslmode=require verifies the chain (libpq does the same).
 */
export function tlsMode(spec: Pick<PgConnSpec, 'sslmode' | 'host'>, files: { ca: boolean; cert: boolean }): SslMode {
  if (spec.sslmode === 'require' && files.ca) return 'verify-ca';
  if (spec.sslmode !== undefined) return spec.sslmode;
  if (spec.host.startsWith('/')) return 'disable';
  return files.ca || files.cert ? 'verify-full' : 'disable';
}

/** Node TLS options for pg (false: plain TCP), from the mode and the files' contents. */
export function tlsOptions(mode: SslMode, files: PgTlsFiles): false | ConnectionOptions {
  if (mode === 'disable') return false;
  const base: ConnectionOptions = {
    ...(files.ca === undefined ? {} : { ca: files.ca }),
    ...(files.cert === undefined ? {} : { cert: files.cert }),
    ...(files.key === undefined ? {} : { key: files.key }),
  };
  if (mode === 'require') return { ...base, rejectUnauthorized: false };
  if (mode === 'verify-ca') return { ...base, rejectUnauthorized: true, checkServerIdentity: () => undefined };
  return { ...base, rejectUnauthorized: true };
}
