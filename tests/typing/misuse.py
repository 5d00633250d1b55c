# Checked by tests/test_public_api.py with mypy: every line marked "error" must be reported.
import loom


@loom.step(id="double")
async def double(x: int) -> int:
    return x * 2


@loom.flow(id="typed")
async def typed(ctx: loom.WorkflowContext, n: int) -> int:
    await ctx.run(double, "three")  # error: wrong argument type
    text: str = await ctx.run(double, 3)  # error: result is an int
    print(text)
    await ctx.run(double, 1, 2)  # error: too many arguments
    await ctx.run(double)  # error: missing argument
    return await ctx.run(double, n)  # fine
