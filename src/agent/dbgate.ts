/**
 * Database access rules at the agent (docs/security.md, "Database users and names"): the one place that decides
 * whether a client may use a database user and a database name. The Proxy carries the user's grant in the dial
 * request (db_access: db_users and db_names of the roles as they stand, templates expanded from the traits,
 * src/auth/rbac.ts databaseGrant); only the agent sees the database protocol, so it reads the client's startup
 * with the parsers of dbproto/ and checks it before the database sees a byte of it:
 *
 *   postgres  SSLRequest / GSSENCRequest are declined ('N': the tunnel encrypts up to the agent), then the
 *             StartupMessage's user and database; a CancelRequest carries neither and passes
 *   mysql     the server's greeting is relayed without CLIENT_SSL and compression, then the HandshakeResponse41's
 *             user and database; later, COM_CHANGE_USER closes the session
 *   redis     every command is followed (dbproto/redis.ts): AUTH and HELLO ... AUTH must name an allowed user
 *             before they reach the server; any other command first needs the user "default" allowed, unless
 *             an AUTH came first and the server accepted it (its first reply is read for that); RESET goes back
 *             to "default". Redis' numbered databases (SELECT) are not checked against db_names
 *   mongodb   every message is read before it goes (dbproto/mongo.ts): an authentication (saslStart with SCRAM or
 *             PLAIN, authenticate, hello's speculativeAuthenticate) must name an allowed user, and every command
 *             but the handshake's (hello, saslStart, ping, ...) an allowed database in $db
 *
 * A refusal is the protocol's own error with the gateway's code in its text (Postgres ErrorResponse 28000, MySQL
 * ERR 1045 / 1044, Redis -NOPERM, MongoDB an error reply with code 13), then the end of the client's stream; the
 * database connection is closed before what was refused reaches it. A dial without a grant, or a startup that
 * cannot be read in time or within the bounds, is refused too. gateDatabase resolves with what the client asked
 * for (protocol, user, database; for Redis and MongoDB filled in as the session names them): the audit of
 * database sessions records these.
 */
import { Duplex, Transform } from 'node:stream';
import { GatewayError } from '../errors.js';
import { grantAllows, type DatabaseGrant, type DatabaseInfo } from '../tunnel/protocol.js';
import { MysqlCommandScanner, mysqlErrPacket, mysqlGreeting, parseMysqlPacket, parseMysqlResponse } from '../dbproto/mysql.js';
import { parsePgStartup, PG_DECLINE, pgErrorResponse } from '../dbproto/postgres.js';
import { MONGO_HANDSHAKE_COMMANDS, MongoCommandScanner, mongoErrorReply, type MongoEvent } from '../dbproto/mongo.js';
import { RedisCommandScanner, redisErrorReply, type RedisEvent } from '../dbproto/redis.js';

export interface DatabaseStartup {
  protocol: DatabaseInfo['protocol'];
  /** The database user the client asked for (absent where the protocol is not read). */
  user?: string;
  database?: string;
}

/** What the gate answers to the client and then splices: the two streams, and what was read of each already. */
export interface GateResult {
  startup: DatabaseStartup;
  /** The client's side to splice with the database (the channel, or a view of it that keeps checking). */
  client: Duplex;
}

/** Why a user or database name is refused, or undefined when the grant allows both. */
export function refusalOf(grant: DatabaseGrant | undefined, user: string | undefined, database: string | undefined): GatewayError | undefined {
  if (grant === undefined) {
    return new GatewayError('GW_ERR_DB_USER_DENIED', 'the Proxy sent no database access decision for this connection', {
      hint: 'The Proxy runs an older version that does not carry db_users and db_names: upgrade it.',
    });
  }
  if (user !== undefined && !grantAllows(grant.users, user)) {
    return new GatewayError('GW_ERR_DB_USER_DENIED', `database user ${quoted(user)} is not allowed by your roles (allowed: ${listed(grant.users.allow)})`);
  }
  if (database !== undefined && !grantAllows(grant.names, database)) {
    return new GatewayError('GW_ERR_DB_NAME_DENIED', `database name ${quoted(database)} is not allowed by your roles (allowed: ${listed(grant.names.allow)})`);
  }
  return undefined;
}

/** A name the client sent, as a message shows it: JSON-quoted (no control characters), at most 64 characters. */
function quoted(value: string): string {
  return JSON.stringify(value.length > 64 ? `${value.slice(0, 64)}...` : value);
}

/** The allowed values, as a message shows them: the first ten, and how many more. */
function listed(values: readonly string[]): string {
  if (values.length === 0) return 'none';
  return values.length > 10 ? `${values.slice(0, 10).join(', ')} and ${values.length - 10} more` : values.join(', ');
}

/** How a refusal reads in a client's terminal: "GW_ERR_DB_USER_DENIED: ... (hint)". */
export function refusalText(e: GatewayError): string {
  return `${e.code}: ${e.message}. ${e.hint}`;
}

/**
 * Reads from stream until parse answers something other than need-more, within timeoutMs and maxBytes; resolves
 * with that answer and every byte read (the caller forwards what follows the parsed message).
 */
export function readUntil<T extends { kind: string }>(stream: Duplex, parse: (buf: Buffer) => T, timeoutMs: number, maxBytes: number, initial: Buffer = Buffer.alloc(0)): Promise<{ result: T; buf: Buffer }> {
  return new Promise((resolve, reject) => {
    let buf: Buffer = initial;
    const done = (err: GatewayError | undefined, result?: T) => {
      clearTimeout(timer);
      stream.off('data', onData);
      stream.off('end', onEnd);
      stream.off('close', onEnd);
      stream.pause();
      if (err) reject(err);
      else resolve({ result: result!, buf });
    };
    const check = () => {
      const result = parse(buf);
      if (result.kind !== 'need-more') return done(undefined, result);
      if (buf.length > maxBytes) done(new GatewayError('GW_ERR_DB_PROTOCOL', `the database startup is longer than ${maxBytes} bytes`));
    };
    const onData = (chunk: Buffer) => {
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      check();
    };
    const onEnd = () => done(new GatewayError('GW_ERR_DB_PROTOCOL', 'the stream ended before the database startup was complete'));
    const timer = setTimeout(() => done(new GatewayError('GW_ERR_DB_PROTOCOL', `no complete database startup within ${timeoutMs} ms`)), timeoutMs);
    stream.on('data', onData);
    stream.once('end', onEnd);
    stream.once('close', onEnd);
    stream.resume(); // an earlier readUntil paused it, and a 'data' listener alone does not undo an explicit pause
    if (buf.length > 0) check();
  });
}

export interface GateOptions {
  protocol: DatabaseInfo['protocol'];
  grant: DatabaseGrant | undefined;
  /** How long the client may take for its startup (and the server for its greeting). */
  timeoutMs: number;
}

/**
 * Checks the client's startup on channel against the grant before target (the database) sees it. Resolves with
 * the client side to splice with target; rejects with the refusal after answering the client in its protocol
 * and closing both.
 */
export async function gateDatabase(channel: Duplex, target: Duplex, options: GateOptions): Promise<GateResult> {
  try {
    switch (options.protocol) {
      case 'postgres':
        return await gatePostgres(channel, target, options);
      case 'mysql':
        return await gateMysql(channel, target, options);
      case 'redis':
        return gateRedis(channel, target, options);
      case 'mongodb':
        return gateMongo(channel, target, options);
      default: {
        // A protocol added to the wire's table (src/wire/protocols.ts) does not compile until it has a gate here.
        const unknown: never = options.protocol;
        throw new GatewayError('GW_ERR_DB_PROTOCOL', `the agent cannot check a database of protocol ${String(unknown)}`);
      }
    }
  } catch (err) {
    target.destroy();
    if (!channel.destroyed) channel.end();
    throw err;
  }
}

async function gatePostgres(channel: Duplex, target: Duplex, options: GateOptions): Promise<GateResult> {
  let rest: Buffer = Buffer.alloc(0);
  for (let declined = 0; ; declined++) {
    const { result, buf } = await readUntil(channel, parsePgStartup, options.timeoutMs, 10_000 + 16, rest);
    if (result.kind === 'ssl-request' || result.kind === 'gssenc-request') {
      // The client may ask for each encryption once; a third ask is not a client, it is a loop.
      if (declined >= 2) return refusePg(channel, new GatewayError('GW_ERR_DB_PROTOCOL', 'encryption asked for more than twice'), '08P01');
      channel.write(PG_DECLINE);
      rest = buf.subarray(result.length);
      continue;
    }
    if (result.kind === 'invalid') return refusePg(channel, new GatewayError('GW_ERR_DB_PROTOCOL', `not a PostgreSQL startup: ${result.reason}`), '08P01');
    if (result.kind === 'need-more') throw new GatewayError('GW_ERR_INTERNAL', 'readUntil returned need-more');
    if (result.kind === 'cancel') {
      target.write(buf);
      return { startup: { protocol: 'postgres' }, client: channel };
    }
    const refusal = refusalOf(options.grant, result.user, result.database);
    if (refusal) return refusePg(channel, refusal, '28000');
    target.write(buf);
    return { startup: { protocol: 'postgres', user: result.user, database: result.database }, client: channel };
  }
}

function refusePg(channel: Duplex, e: GatewayError, sqlstate: string): never {
  channel.write(pgErrorResponse(sqlstate, refusalText(e)));
  throw e;
}

async function gateMysql(channel: Duplex, target: Duplex, options: GateOptions): Promise<GateResult> {
  const greeting = await readUntil(target, parseMysqlPacket, options.timeoutMs, 64 * 1024 + 4);
  if (greeting.result.kind !== 'packet') throw new GatewayError('GW_ERR_DB_PROTOCOL', `the database's greeting: ${greeting.result.kind === 'invalid' ? greeting.result.reason : 'incomplete'}`);
  const relayed = mysqlGreeting(greeting.buf.subarray(0, greeting.result.length));
  if (relayed.kind === 'invalid') throw new GatewayError('GW_ERR_DB_PROTOCOL', `the database's greeting: ${relayed.reason}`);
  channel.write(relayed.packet);
  if (relayed.kind === 'server-error') throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', 'the database refused the connection before the handshake');
  const serverRest = greeting.buf.subarray(greeting.result.length);
  const { result, buf } = await readUntil(channel, parseMysqlPacket, options.timeoutMs, 64 * 1024 + 4);
  const seq = result.kind === 'packet' ? result.seq + 1 : 2;
  const refuse = (e: GatewayError, code: number, sqlstate: string): never => {
    channel.write(mysqlErrPacket(seq, code, sqlstate, refusalText(e)));
    throw e;
  };
  if (result.kind !== 'packet') return refuse(new GatewayError('GW_ERR_DB_PROTOCOL', `not a MySQL handshake response: ${result.kind === 'invalid' ? result.reason : 'incomplete'}`), 1043, '08S01');
  const response = parseMysqlResponse(result.payload);
  if (response.kind === 'invalid') return refuse(new GatewayError('GW_ERR_DB_PROTOCOL', `not a usable MySQL handshake response: ${response.reason}`), 1043, '08S01');
  const refusal = refusalOf(options.grant, response.user, response.database);
  if (refusal) return refusal.code === 'GW_ERR_DB_NAME_DENIED' ? refuse(refusal, 1044, '42000') : refuse(refusal, 1045, '28000');
  target.write(buf.subarray(0, result.length));
  if (serverRest.length > 0) channel.write(serverRest);
  const client = scanned(channel, new MysqlCommandScanner(), buf.subarray(result.length), (violation) => {
    const e = new GatewayError('GW_ERR_DB_USER_DENIED', `${violation} is not allowed through the gateway`, { hint: 'Open a new connection as the other database user.' });
    channel.end(mysqlErrPacket(1, 1045, '28000', refusalText(e)));
    target.destroy();
  });
  return { startup: { protocol: 'mysql', user: response.user, ...(response.database === undefined ? {} : { database: response.database }) }, client };
}

/**
 * The client's side of the splice seen through a scanner: reads give what the scanner lets through, writes go to
 * the channel. At a violation nothing more is read, and onViolation answers and closes.
 */
function scanned(channel: Duplex, scanner: { push(chunk: Buffer): { forward: number; violation?: string } }, initial: Buffer, onViolation: (violation: string) => void): Duplex {
  let stopped = false;
  const filter = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      if (stopped) return cb();
      const { forward, violation } = scanner.push(chunk);
      if (forward > 0) this.push(chunk.subarray(0, forward));
      if (violation !== undefined) {
        stopped = true;
        onViolation(violation);
      }
      cb();
    },
  });
  if (initial.length > 0) filter.write(initial);
  channel.pipe(filter);
  channel.once('close', () => {
    if (!channel.readableEnded) filter.destroy(new Error('the client stream closed without an end'));
  });
  return Duplex.from({ readable: filter, writable: channel });
}

/** Redis: the rules at the top of this file, applied command by command as the client's bytes pass. */
function gateRedis(channel: Duplex, target: Duplex, options: GateOptions): GateResult {
  const grant = options.grant;
  if (!grant) throw refusalOf(undefined, undefined, undefined)!;
  const startup: DatabaseStartup = { protocol: 'redis' };
  /** Whether the server's user is known to be allowed (an ordinary command needs it). */
  let established = false;
  const allowed = (user: string) => refusalOf(grant, user, undefined);
  const decide = async (ev: RedisEvent, release: () => void): Promise<GatewayError | undefined> => {
    if (ev.kind === 'start') return undefined;
    if (ev.kind === 'invalid') return new GatewayError('GW_ERR_DB_PROTOCOL', `not a Redis request the agent can check: ${ev.reason}`);
    if (ev.user !== undefined) {
      const no = allowed(ev.user);
      if (no) return no;
      if (ev.name === 'reset' || established) return undefined;
      // The first command authenticates: whether the server took it decides who the next commands run as.
      release();
      const first = await firstReplyByte(target);
      startup.user = first === 0x2d /* '-' */ ? 'default' : ev.user;
      established = startup.user === ev.user;
      return established ? undefined : allowed('default');
    }
    if (established) return undefined;
    startup.user = 'default';
    established = true;
    return allowed('default');
  };
  const client = followed(channel, new RedisCommandScanner(), decide, (e) => {
    target.destroy();
    channel.end(redisErrorReply(refusalText(e)));
  });
  return { startup, client };
}

/**
 * MongoDB: every message's command is read before it goes (dbproto/mongo.ts); an authentication must name an
 * allowed user, and every command but the handshake's must name an allowed database in $db.
 */
function gateMongo(channel: Duplex, target: Duplex, options: GateOptions): GateResult {
  const grant = options.grant;
  if (!grant) throw refusalOf(undefined, undefined, undefined)!;
  const startup: DatabaseStartup = { protocol: 'mongodb' };
  let last: { requestId: number; op: 'msg' | 'query' } = { requestId: 0, op: 'msg' };
  const decide = async (ev: MongoEvent): Promise<GatewayError | undefined> => {
    if (ev.kind === 'start') return undefined;
    if (ev.kind === 'invalid') {
      if (ev.requestId !== undefined && ev.op !== undefined) last = { requestId: ev.requestId, op: ev.op };
      return new GatewayError('GW_ERR_DB_PROTOCOL', `not a MongoDB message the agent can check: ${ev.reason}`);
    }
    last = { requestId: ev.requestId, op: ev.op };
    if (ev.user !== undefined) {
      const no = refusalOf(grant, ev.user, undefined);
      if (no) return no;
      startup.user = ev.user;
    }
    if (MONGO_HANDSHAKE_COMMANDS.has(ev.command)) return undefined;
    startup.database ??= ev.db;
    return refusalOf(grant, undefined, ev.db);
  };
  const client = followed(channel, new MongoCommandScanner(), decide, (e) => {
    target.destroy();
    channel.end(mongoErrorReply(last.requestId, last.op, refusalText(e)));
  });
  return { startup, client };
}

/**
 * The client's side of the splice, following its commands: the bytes of each command are held from its 'start'
 * until its 'ready' event and decide() lets it through (decide may release what is held early, and wait); a
 * refusal (or an 'invalid' event, which decide turns into one) stops everything and refuse() answers.
 */
function followed<E extends { kind: string; at: number }>(
  channel: Duplex,
  scanner: { push(chunk: Buffer): E[] },
  decide: (ev: E, release: () => void) => Promise<GatewayError | undefined>,
  refuse: (e: GatewayError) => void,
): Duplex {
  let held: Buffer[] = [];
  let holding = true;
  let stopped = false;
  const filter = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      const send = (b: Buffer) => b.length > 0 && this.push(b);
      const release = () => {
        for (const b of held) send(b);
        held = [];
      };
      const route = (b: Buffer) => (holding ? b.length > 0 && held.push(b) : send(b));
      (async () => {
        if (stopped) return;
        let pos = 0;
        for (const ev of scanner.push(chunk)) {
          route(chunk.subarray(pos, ev.at));
          pos = ev.at;
          if (ev.kind === 'start') {
            holding = true;
            continue;
          }
          const no = await decide(ev, release);
          if (no) {
            stopped = true;
            return refuse(no);
          }
          release();
          holding = false;
        }
        route(chunk.subarray(pos));
      })().then(() => cb(), (err: unknown) => cb(err as Error));
    },
  });
  channel.pipe(filter);
  channel.once('close', () => {
    if (!channel.readableEnded) filter.destroy(new Error('the client stream closed without an end'));
  });
  return Duplex.from({ readable: filter, writable: channel });
}

/** The first byte the server answers with (undefined when it closes first). */
function firstReplyByte(target: Duplex): Promise<number | undefined> {
  return new Promise((resolve) => {
    const onData = (c: Buffer) => {
      target.off('close', onClose);
      resolve(c[0]);
    };
    const onClose = () => {
      target.off('data', onData);
      resolve(undefined);
    };
    target.once('data', onData);
    target.once('close', onClose);
  });
}
