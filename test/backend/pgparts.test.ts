/** The PostgreSQL backend's pure parts: the connection string and TLS mode, error classification, the write plan. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { WriteOp } from '../../src/backend/index.js';
import { ConnStringError, parsePgConnString, tlsMode, tlsOptions } from '../../src/backend/pgconn.js';
import { isConnectionLoss, pgFailure, type PgErrorContext } from '../../src/backend/pgerrors.js';
import { planWrite } from '../../src/backend/plan.js';

describe('parsePgConnString', () => {
  it('reads address, login, database and parameters, percent-decoded, and shows the password as ***', () => {
    expect(parsePgConnString('postgresql://gw%40x:p%2Fw%3A@db.internal:6432/cluster%20state?sslmode=verify-ca&application_name=auth-1&connect_timeout=7')).toEqual({
      host: 'db.internal',
      port: 6432,
      user: 'gw@x',
      password: 'p/w:',
      database: 'cluster state',
      sslmode: 'verify-ca',
      applicationName: 'auth-1',
      connectTimeoutMs: 7000,
      display: 'postgresql://gw%40x:***@db.internal:6432/cluster%20state?sslmode=verify-ca&application_name=auth-1&connect_timeout=7',
      address: 'db.internal:6432',
    });
    expect(parsePgConnString('postgres://[2001:db8::1]/gw')).toMatchObject({ host: '2001:db8::1', port: 5432, user: undefined, address: '[2001:db8::1]:5432' });
    expect(parsePgConnString('postgresql://gw@/gw?host=/run/postgresql')).toMatchObject({ host: '/run/postgresql', user: 'gw', address: '/run/postgresql/.s.PGSQL.5432' });
  });

  it.each([
    ['mysql://db/gw', 'postgresql://'],
    ['host=db password=s3cret-pw', 'keyword=value'],
    ['postgresql://db', 'no database'],
    ['postgresql://db/gw?sslmode=prefer', 'plain text'],
    ['postgresql://db/gw?sslmode=allow', 'plain text'],
    ['postgresql://db/gw?sslmode=on', 'verify-full'],
    ['postgresql://db/gw?sslrootcert=/x', 'ca_file'],
    ['postgresql://db/gw?connect_timeout=0', 'connect_timeout'],
    ['postgresql://db/gw?sslmode=disable&sslmode=require', 'twice'],
    ['postgresql://db1,db2/gw', 'one host'],
    ['postgresql://u:s3cret-pw@db/gw#x', 'fragment'],
    ['postgresql://u:s3cret-pw@db/gw?host=run', 'absolute path'],
    ['postgresql://u:s3cret-pw@db/gw?host=/run', 'twice'],
    ['postgresql://u:%zz@db/gw', 'percent-encoding'],
  ])('refuses %s, saying why without the password', (text, words) => {
    let err: unknown;
    try {
      parsePgConnString(text);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConnStringError);
    const { message, hint } = err as ConnStringError;
    expect(`${message} ${hint}`).toContain(words);
    expect(`${message} ${hint}`).not.toContain('s3cret-pw');
  });

  it('never puts the password in display, whatever it holds', () => {
    fc.assert(
      fc.property(fc.string({ minLength: 3 }).filter((p) => p.trim().length >= 3), (password) => {
        const text = `postgresql://gw:${encodeURIComponent(password)}@db/gw`;
        const spec = parsePgConnString(text);
        expect(spec.password).toBe(password);
        expect(spec.display).toBe('postgresql://gw:***@db/gw');
      }),
    );
  });
});

describe('TLS mode', () => {
  const tcp = { host: 'db' };
  it('follows sslmode; TLS files mean verify-full; a CA makes require verify the chain', () => {
    expect(tlsMode({ ...tcp, sslmode: undefined }, { ca: false, cert: false })).toBe('disable');
    expect(tlsMode({ ...tcp, sslmode: undefined }, { ca: true, cert: false })).toBe('verify-full');
    expect(tlsMode({ ...tcp, sslmode: undefined }, { ca: false, cert: true })).toBe('verify-full');
    expect(tlsMode({ ...tcp, sslmode: 'require' }, { ca: false, cert: false })).toBe('require');
    expect(tlsMode({ ...tcp, sslmode: 'require' }, { ca: true, cert: false })).toBe('verify-ca');
    expect(tlsMode({ ...tcp, sslmode: 'disable' }, { ca: true, cert: true })).toBe('disable');
    expect(tlsMode({ host: '/run/postgresql', sslmode: undefined }, { ca: true, cert: false })).toBe('disable');
  });

  it('verifies the chain from verify-ca on, and the name only with verify-full', () => {
    expect(tlsOptions('disable', {})).toBe(false);
    expect(tlsOptions('require', { ca: 'CA' })).toMatchObject({ rejectUnauthorized: false });
    const ca = tlsOptions('verify-ca', { ca: 'CA' });
    expect(ca).toMatchObject({ rejectUnauthorized: true, ca: 'CA' });
    expect(ca && ca.checkServerIdentity?.('db', {} as never)).toBeUndefined();
    const full = tlsOptions('verify-full', { ca: 'CA', cert: 'C', key: 'K' });
    expect(full).toEqual({ ca: 'CA', cert: 'C', key: 'K', rejectUnauthorized: true });
  });
});

describe('pgFailure', () => {
  const ctx: PgErrorContext = { display: 'postgresql://gw:***@db:5432/gw', address: 'db:5432', user: 'gw', database: 'gw', phase: 'open' };
  const pgError = (code: string, message: string) => Object.assign(new Error(message), { code, severity: 'FATAL' });
  const sockError = (code: string) => Object.assign(new Error(`connect ${code} 10.0.0.1:5432`), { code });

  it.each([
    [sockError('ECONNREFUSED'), 'GW_ERR_BACKEND_UNREACHABLE', 'connection refused'],
    [sockError('ENOTFOUND'), 'GW_ERR_BACKEND_UNREACHABLE', 'does not resolve'],
    [sockError('EHOSTUNREACH'), 'GW_ERR_BACKEND_UNREACHABLE', 'no route'],
    [new Error('timeout expired'), 'GW_ERR_BACKEND_UNREACHABLE', 'timed out'],
    [new Error('Connection terminated unexpectedly'), 'GW_ERR_BACKEND_UNREACHABLE', 'was lost'],
    [pgError('57P01', 'terminating connection due to administrator command'), 'GW_ERR_BACKEND_UNREACHABLE', 'was lost'],
    [pgError('53300', 'sorry, too many clients already'), 'GW_ERR_BACKEND_UNREACHABLE', 'no free connection slot'],
    [pgError('28P01', 'password authentication failed for user "gw"'), 'GW_ERR_BACKEND_AUTH', 'wrong password'],
    [pgError('28000', 'no pg_hba.conf entry for host "10.0.0.9", user "gw", database "gw", no encryption'), 'GW_ERR_BACKEND_AUTH', 'only over TLS'],
    [pgError('28000', 'certificate authentication failed for user "gw"'), 'GW_ERR_BACKEND_AUTH', 'client certificate'],
    [new Error('SASL: SCRAM-SERVER-FIRST-MESSAGE: client password must be a string'), 'GW_ERR_BACKEND_AUTH', 'none was given'],
    [new Error('The server does not support SSL connections'), 'GW_ERR_BACKEND_TLS', 'does not accept TLS'],
    [Object.assign(new Error('error:0A000418:SSL routines::tlsv1 alert unknown ca'), { code: 'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA' }), 'GW_ERR_BACKEND_TLS', 'client certificate'],
    [Object.assign(new Error('unable to verify the first certificate'), { code: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' }), 'GW_ERR_CLIENT_UNTRUSTED', 'ca_file'],
    [pgError('3D000', 'database "gw" does not exist'), 'GW_ERR_BACKEND_OPEN', 'does not exist'],
    [pgError('42501', 'permission denied for schema public'), 'GW_ERR_BACKEND_OPEN', 'privilege'],
    [pgError('XX000', 'something odd'), 'GW_ERR_BACKEND_OPEN', 'something odd'],
  ])('%s → %s', (err, code, words) => {
    const e = pgFailure(err, ctx);
    expect(e.code).toBe(code);
    expect(`${e.message} ${e.hint}`).toContain(words);
    expect(e.message.startsWith(`cannot open the backend ${ctx.display}: `)).toBe(true);
  });

  it('says an operation failed (not the opening), and that a lost write may have been applied', () => {
    const op = { ...ctx, phase: 'op' as const };
    expect(pgFailure(pgError('XX000', 'odd'), op).code).toBe('GW_ERR_BACKEND_FAILED');
    expect(pgFailure(pgError('55P03', 'canceling statement due to lock timeout'), op).code).toBe('GW_ERR_BACKEND_FAILED');
    const lost = pgFailure(new Error('Connection terminated unexpectedly'), op);
    expect(lost.message).toContain('may or may not have been applied');
  });

  it('counts only connection failures as losses (those are safe to retry before COMMIT)', () => {
    expect(isConnectionLoss(pgError('57P01', 'x'))).toBe(true);
    expect(isConnectionLoss(pgError('08006', 'x'))).toBe(true);
    expect(isConnectionLoss(Object.assign(new Error('x'), { code: 'ECONNRESET' }))).toBe(true);
    expect(isConnectionLoss(pgError('23505', 'duplicate key'))).toBe(false);
    expect(isConnectionLoss(pgError('55P03', 'lock timeout'))).toBe(false);
    expect(isConnectionLoss(new Error('some bug'))).toBe(false);
  });
});

describe('planWrite', () => {
  const live = (keys: string[]) => ({ live: (k: string) => keys.includes(k), liveUnder: (p: string) => keys.filter((k) => k.startsWith(p)) });
  const noTtl = () => undefined;

  it('lets each op see the earlier ones and ends with one final row per key', () => {
    const ops: WriteOp[] = [
      { type: 'put', key: '/n/b', value: '1' },
      { type: 'delete', key: '/n/a' },
      { type: 'put', key: '/n/c', value: '2' },
      { type: 'deleteRange', prefix: '/n/' },
      { type: 'put', key: '/n/c', value: '3' },
      { type: 'delete', key: '/absent' },
    ];
    const plan = planWrite(ops, live(['/n/a', '/n/z']), noTtl);
    expect(plan.events).toEqual([
      { type: 'put', key: '/n/b', value: '1', expiresAt: undefined },
      { type: 'delete', key: '/n/a' },
      { type: 'put', key: '/n/c', value: '2', expiresAt: undefined },
      { type: 'delete', key: '/n/b' },
      { type: 'delete', key: '/n/c' },
      { type: 'delete', key: '/n/z' },
      { type: 'put', key: '/n/c', value: '3', expiresAt: undefined },
    ]);
    expect([...plan.upserts]).toEqual([['/n/c', { value: '3', expiresAt: undefined }]]);
    expect([...plan.deletes].sort()).toEqual(['/n/a', '/n/b', '/n/z']);
  });

  it('changes nothing when nothing is live to delete', () => {
    const plan = planWrite([{ type: 'delete', key: '/a' }, { type: 'deleteRange', prefix: '/b' }], live([]), noTtl);
    expect(plan.events).toEqual([]);
    expect(plan.upserts.size + plan.deletes.size).toBe(0);
  });
});
