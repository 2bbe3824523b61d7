/**
 * What a PostgreSQL or socket failure means for the backend, in one place: each cause its own code, message and
 * hint (the server cannot be reached, it refused the login, TLS failed, the database is missing, ...). Messages
 * name the server by the connection string with its password as "***" and never hold a secret. Pure: no I/O.
 */
import { GatewayError, type ErrorCode } from '../errors.js';
import { tlsVerifyError } from '../dial/tlsverify.js';

export interface PgErrorContext {
  /** The connection string, password redacted. */
  display: string;
  /** host:port or socket path. */
  address: string;
  user: string | undefined;
  database: string;
  /** open: while opening the backend (messages say "cannot open the backend"); op: during an operation. */
  phase: 'open' | 'op';
}

interface Described {
  code: ErrorCode;
  reason: string;
  hint: string;
}

const UNREACHABLE_SOCKET = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EAI_NONAME', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOENT']);
const LOST_SOCKET = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED']);
const LOST_MESSAGES = [
  'Connection terminated unexpectedly',
  'Connection terminated',
  'Client has encountered a connection error and is not queryable',
  'Client was closed and is not queryable',
  'timeout expired',
  'Query read timeout',
];

function fieldOf(err: unknown, name: string): string | undefined {
  const v = (err as Record<string, unknown> | null)?.[name];
  return typeof v === 'string' ? v : undefined;
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** The SQLSTATE of a server error, or undefined for client-side and socket errors. */
export function sqlState(err: unknown): string | undefined {
  const code = fieldOf(err, 'code');
  return code !== undefined && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/**
 * True when err says the connection is gone or could not be made (so that nothing of a transaction not yet
 * committed was applied): socket errors, the server shutting down or terminating the session, pg's own
 * "connection terminated" errors.
 */
export function isConnectionLoss(err: unknown): boolean {
  const state = sqlState(err);
  if (state !== undefined) return state.startsWith('08') || state === '57P01' || state === '57P02' || state === '57P03';
  const code = fieldOf(err, 'code');
  if (code !== undefined && (UNREACHABLE_SOCKET.has(code) || LOST_SOCKET.has(code))) return true;
  const message = messageOf(err);
  return LOST_MESSAGES.some((m) => message.startsWith(m));
}

function who(ctx: PgErrorContext): string {
  return ctx.user === undefined ? 'the default user' : `user ${JSON.stringify(ctx.user)}`;
}

function describeSocket(err: unknown, ctx: PgErrorContext): Described | undefined {
  const code = fieldOf(err, 'code') ?? '';
  const message = messageOf(err);
  const check = `Check that PostgreSQL runs and listens at ${ctx.address} (listen_addresses and port in postgresql.conf), and that the network and firewalls let this machine reach it.`;
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN' || code === 'EAI_NONAME') {
    return { code: 'GW_ERR_BACKEND_UNREACHABLE', reason: `the host name of ${ctx.address} does not resolve (${code})`, hint: 'Check the host name in gateway.storage.conn_string and this machine\'s DNS.' };
  }
  if (code === 'ECONNREFUSED' || code === 'ENOENT') {
    return { code: 'GW_ERR_BACKEND_UNREACHABLE', reason: `PostgreSQL at ${ctx.address} is unreachable: connection refused`, hint: check };
  }
  if (code === 'ETIMEDOUT' || message.startsWith('timeout expired') || message.includes('connection timeout')) {
    return { code: 'GW_ERR_BACKEND_UNREACHABLE', reason: `PostgreSQL at ${ctx.address} is unreachable: the connection timed out`, hint: `${check} A firewall that drops packets shows as a timeout.` };
  }
  if (code === 'EHOSTUNREACH' || code === 'ENETUNREACH') {
    return { code: 'GW_ERR_BACKEND_UNREACHABLE', reason: `PostgreSQL at ${ctx.address} is unreachable: no route to the host (${code})`, hint: check };
  }
  if (isConnectionLoss(err)) {
    const during = ctx.phase === 'op' ? ' (a write that failed this way may or may not have been applied: read the item again before retrying)' : '';
    return { code: 'GW_ERR_BACKEND_UNREACHABLE', reason: `the connection to PostgreSQL at ${ctx.address} was lost: ${message}${during}`, hint: `${check} The gateway reconnects by itself once the server is back.` };
  }
  return undefined;
}

function describeTls(err: unknown, ctx: PgErrorContext): Described | undefined {
  const message = messageOf(err);
  const code = fieldOf(err, 'code') ?? '';
  if (message === 'The server does not support SSL connections') {
    return {
      code: 'GW_ERR_BACKEND_TLS',
      reason: `PostgreSQL at ${ctx.address} does not accept TLS (ssl is off on the server)`,
      hint: 'Turn ssl on in the server\'s postgresql.conf (with ssl_cert_file and ssl_key_file), or connect without TLS: sslmode=disable and no ca_file/cert_file (only on a trusted network).',
    };
  }
  if (message === 'There was an error establishing an SSL connection') {
    return { code: 'GW_ERR_BACKEND_TLS', reason: `PostgreSQL at ${ctx.address} answered the TLS request with an error`, hint: 'Check that the address is a PostgreSQL server and look at its log.' };
  }
  if (code.startsWith('ERR_SSL_') && /certificate|alert/i.test(message)) {
    return {
      code: 'GW_ERR_BACKEND_TLS',
      reason: `PostgreSQL at ${ctx.address} refused the TLS handshake (${message.replace(/^error:[0-9A-F]+:SSL routines::/, '')})`,
      hint: "The server did not accept this side's client certificate: check that gateway.storage.cert_file is signed by a CA in the server's ssl_ca_file and has not expired.",
    };
  }
  if (code.startsWith('ERR_SSL_') || code.startsWith('ERR_OSSL_') || code === 'ERR_TLS_HANDSHAKE_TIMEOUT') {
    return { code: 'GW_ERR_BACKEND_TLS', reason: `TLS to PostgreSQL at ${ctx.address} failed: ${message}`, hint: 'Check gateway.storage.cert_file and key_file (a matching PEM pair) and the server\'s TLS settings.' };
  }
  return undefined;
}

function describeServer(err: unknown, ctx: PgErrorContext): Described | undefined {
  const state = sqlState(err);
  const message = messageOf(err);
  const hba = `the server's pg_hba.conf line for ${who(ctx)}, database ${JSON.stringify(ctx.database)} and this machine's address`;
  if (state === '28P01') {
    return { code: 'GW_ERR_BACKEND_AUTH', reason: `PostgreSQL refused the login of ${who(ctx)}: wrong password`, hint: 'Check the password of the user (in the connection string, PGPASSWORD or ~/.pgpass), or use a client certificate (cert_file, key_file) with a pg_hba.conf "cert" line.' };
  }
  if (state === '28000') {
    if (/no encryption/.test(message)) {
      return { code: 'GW_ERR_BACKEND_AUTH', reason: `PostgreSQL refused the login of ${who(ctx)}: it accepts this user only over TLS (${message})`, hint: 'Connect with TLS: sslmode=verify-full and gateway.storage.ca_file (the CA of the server\'s certificate).' };
    }
    if (/certificate/.test(message)) {
      return { code: 'GW_ERR_BACKEND_AUTH', reason: `PostgreSQL refused the client certificate for ${who(ctx)} (${message})`, hint: `The certificate's CN must be the database user name (or mapped to it in pg_ident.conf); check gateway.storage.cert_file and ${hba}.` };
    }
    return { code: 'GW_ERR_BACKEND_AUTH', reason: `PostgreSQL refused the login of ${who(ctx)} (${message})`, hint: `Check ${hba}.` };
  }
  if (message.includes('client password must be a string') || (message.includes('SASL') && message.includes('password'))) {
    return { code: 'GW_ERR_BACKEND_AUTH', reason: `PostgreSQL asks ${who(ctx)} for a password and none was given`, hint: 'Give the password in the connection string, PGPASSWORD or ~/.pgpass, or log in with a client certificate (cert_file, key_file).' };
  }
  if (state === '3D000') {
    return { code: 'GW_ERR_BACKEND_OPEN', reason: `the database ${JSON.stringify(ctx.database)} does not exist`, hint: `Create it (createdb -O ${ctx.user ?? 'USER'} ${ctx.database}) or name an existing one in the connection string.` };
  }
  if (state === '42501') {
    return { code: 'GW_ERR_BACKEND_OPEN', reason: `${who(ctx)} lacks a privilege the backend needs (${message})`, hint: `Make the user own the database, or GRANT CREATE ON SCHEMA public (and the tables' privileges) to it.` };
  }
  if (state === '53300' || state === '53400') {
    return { code: 'GW_ERR_BACKEND_UNREACHABLE', reason: `PostgreSQL at ${ctx.address} has no free connection slot (${message})`, hint: 'Raise max_connections on the server, or lower the number of Auth Services and other clients.' };
  }
  if (state === '55P03') {
    return { code: 'GW_ERR_BACKEND_FAILED', reason: `the backend's write lock was held too long by another Auth Service (${message})`, hint: 'Look for a stuck Auth Service or a long transaction on the database (pg_stat_activity); the write can be retried.' };
  }
  return undefined;
}

/** The GatewayError for a PostgreSQL, TLS or socket failure in ctx. */
export function pgFailure(err: unknown, ctx: PgErrorContext): GatewayError {
  if (err instanceof GatewayError) return err;
  const prefix = ctx.phase === 'open' ? `cannot open the backend ${ctx.display}: ` : `backend ${ctx.display}: `;
  const details = { address: ctx.address, ...(sqlState(err) === undefined ? {} : { sqlState: sqlState(err) }) };
  const verify = tlsVerifyError(err, {
    address: ctx.address,
    server: 'server',
    untrustedHint: "Set gateway.storage.ca_file to the CA that signs the PostgreSQL server's certificate (ssl_cert_file on the server).",
  });
  if (verify) return new GatewayError(verify.code, prefix + verify.message, { hint: verify.hint, cause: err, details: { ...verify.details, ...details } });
  const described = describeTls(err, ctx) ?? describeServer(err, ctx) ?? describeSocket(err, ctx);
  if (described) return new GatewayError(described.code, prefix + described.reason, { hint: described.hint, cause: err, details });
  const code: ErrorCode = ctx.phase === 'open' ? 'GW_ERR_BACKEND_OPEN' : 'GW_ERR_BACKEND_FAILED';
  return new GatewayError(code, `${prefix}${messageOf(err)}`, {
    hint: 'Look at the PostgreSQL server log for this error.',
    cause: err,
    details,
  });
}
