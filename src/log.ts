/**
 * Logging: pino, one child logger per component. JSON lines by default; readable text when the output is a
 * terminal (or GATEWAY_LOG_FORMAT=text). Known secret-bearing fields are redacted by pino itself.
 *
 * A daemon outlives its terminal: `gateway start | head -3` closes the pipe (EPIPE), a closed terminal answers
 * writes with EIO. Node makes either an 'error' event on process.stdout / process.stderr, and an 'error' nobody
 * listens to ends the process. survivingOutput() listens, so the daemon goes on; logs that went to the lost
 * stream go on in a file instead (outlivingDestination: the first line there says why it is there).
 */
import { createRequire } from 'node:module';
import { Writable } from 'node:stream';
import { destination as fileDestination, pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino';
import type PinoPretty from 'pino-pretty';

/** pino-pretty, loaded (synchronously: it is CommonJS) only for text output: JSON logs, the daemon's usual, never need it. */
const pretty = (options: PinoPretty.PrettyOptions): PinoPretty.PrettyStream => (createRequire(import.meta.url)('pino-pretty') as typeof PinoPretty)(options);

export type { Logger } from 'pino';

export type LogFormat = 'json' | 'text';
export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal' | 'silent';

export const LOG_LEVELS: readonly LogLevel[] = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

export interface LogSettings {
  level?: LogLevel;
  format?: LogFormat;
  /** Where lines go; standard error by default (standard output stays for command results). */
  destination?: DestinationStream | NodeJS.WritableStream;
}

const REDACT_PATHS = [
  'password',
  'token',
  'secret',
  'privateKey',
  'private_key',
  'authorization',
  'proxyAuthorization',
  '*.password',
  '*.token',
  '*.secret',
  '*.privateKey',
  '*.private_key',
  'headers.authorization',
  'headers["proxy-authorization"]',
];

/** The errors that say the reader of a standard stream is gone (a closed pipe, a closed terminal, a reset socket). */
const LOST_OUTPUT = new Set(['EPIPE', 'EIO', 'ECONNRESET', 'ERR_STREAM_DESTROYED', 'ENXIO']);

/**
 * Keeps the process alive when stream (process.stdout or process.stderr) loses its reader: the 'error' Node emits
 * then is taken here instead of ending the process. onLost runs once, with the error's code; writes after it are
 * dropped by Node (the stream is destroyed). Any other error on the stream is passed to onOther (default: thrown,
 * as Node would have).
 */
export function survivingOutput(stream: NodeJS.WritableStream, onLost: (code: string) => void, onOther: (err: Error) => void = (err) => { throw err; }): void {
  let lost = false;
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (!LOST_OUTPUT.has(err.code ?? '')) return onOther(err);
    if (lost) return;
    lost = true;
    onLost(err.code!);
  });
}

/**
 * A log destination over a standard stream that, once the stream has lost its reader, writes to the file
 * fallbackPath instead (created 0600 by the caller's rules: see ensure), opened only then. The first line written
 * there is a JSON line saying which stream was lost and why; then the lines whose write to the stream failed, then
 * every later one.
 */
export function outlivingDestination(
  stream: NodeJS.WritableStream & { destroyed?: boolean },
  options: { name: string; fallbackPath: string; ensure?: (path: string) => void },
): NodeJS.WritableStream & { readonly fallback: boolean } {
  let file: ReturnType<typeof fileDestination> | undefined;
  let lostCode: string | undefined;
  const toFile = (code: string): ReturnType<typeof fileDestination> => {
    if (!file) {
      options.ensure?.(options.fallbackPath);
      file = fileDestination({ dest: options.fallbackPath, mkdir: true, sync: true });
      file.write(`${JSON.stringify({ level: 40, time: Date.now(), pid: process.pid, component: 'log', stream: options.name, error: code, msg: `${options.name} is gone (${code}): logging continues in this file` })}\n`);
    }
    return file;
  };
  survivingOutput(stream, (code) => (lostCode = code), () => (lostCode ??= 'error'));
  const out = new Writable({
    decodeStrings: false,
    write(chunk: string | Buffer, _encoding, callback) {
      const line = chunk.toString();
      if (lostCode === undefined && stream.destroyed) lostCode = 'ERR_STREAM_DESTROYED';
      if (lostCode !== undefined) toFile(lostCode).write(line);
      else {
        // A line whose write fails (the one that met the closed pipe, and any written before Node reported it)
        // is written again to the file: none is lost.
        stream.write(line, (err?: Error | null) => {
          if (!err) return;
          lostCode ??= (err as NodeJS.ErrnoException).code ?? 'error';
          toFile(lostCode).write(line);
        });
      }
      callback();
    },
  });
  Object.defineProperty(out, 'isTTY', { value: Boolean((stream as { isTTY?: boolean }).isTTY) }); // createLogger's default format
  return Object.defineProperty(out, 'fallback', { get: () => file !== undefined }) as Writable & { readonly fallback: boolean };
}

export function createLogger(settings: LogSettings = {}): Logger {
  const destination = settings.destination ?? process.stderr;
  const isTty = 'isTTY' in destination && Boolean((destination as { isTTY?: boolean }).isTTY);
  const format = settings.format ?? (isTty ? 'text' : 'json');
  const options: LoggerOptions = {
    level: settings.level ?? 'info',
    base: { pid: process.pid },
    redact: { paths: REDACT_PATHS, censor: '***' },
  };
  if (format === 'text') {
    return pino(options, pretty({ destination: destination as NodeJS.WritableStream, colorize: isTty, sync: true }));
  }
  return pino(options, destination as DestinationStream);
}

/**
 * The process-wide root logger; CLIs replace it once they know the configured level and format. Made on first
 * use: a command that logs nothing makes none (and loads no pino-pretty when standard error is a terminal).
 */
let root: Logger | undefined;

export function setRootLogger(logger: Logger): void {
  root = logger;
}

export function logger(component: string): Logger {
  root ??= createLogger({ level: (process.env.GATEWAY_LOG_LEVEL as LogLevel | undefined) ?? 'info' });
  return root.child({ component });
}
