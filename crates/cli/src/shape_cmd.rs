//! `ring0 shape [--budget BYTES] [--json]`: shapes standard input.

use clap::Args;
use ring0_shape::{OutputFormat, ShapeConfig, render, shape_reader};

#[derive(Args)]
pub struct ShapeArgs {
    /// Model-visible budget in bytes.
    #[arg(long, default_value_t = ring0_shape::config::BUDGET_BYTES_DEFAULT)]
    budget: usize,
    /// Print the whole observation envelope as JSON instead of its text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ShapeArgs) -> Result<String, String> {
    let config = ShapeConfig {
        budget_bytes: args.budget,
        ..ShapeConfig::default()
    };
    let observation = shape_reader(std::io::stdin().lock(), &config).map_err(|e| e.to_string())?;
    let format = if args.json {
        OutputFormat::Json
    } else {
        OutputFormat::Text
    };
    Ok(render(&observation, format))
}
