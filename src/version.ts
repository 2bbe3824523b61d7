/** The product version: gwctl and gwsh are 17.0.0-dev or later (seed, Versioning 2). */
export const VERSION = '17.0.0-dev';
