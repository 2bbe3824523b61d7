/**
 * Logging: pino, one child logger per component. JSON lines by default; readable text when the output is a
 * terminal (or GATEWAY_LOG_FORMAT=text). Known secret-bearing fields are redacted by pino itself.
 */
import { createRequire } from 'node:module';
import { pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino';
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
